"""The one place the package chooses how a process ends: library code raises, and an uncaught exception that
carries an `exit_code` ends the process with that code once the process opted in (use_exit_codes()).

Why a hook at all: Python ends a process with 1 on any uncaught exception, and a restart policy retries 1. A
FrameContractError must end it with 65 (EX_DATAERR, common/exit_codes.h's kFrameContract), which the supervisor
never restarts: a restart meets the same frame, or publishes the same shapes. Only sys.excepthook sees an uncaught
exception before the interpreter picks 1, so use_exit_codes() installs one.

Who opts in (docs/design.md, "Python: exceptions, and who exits"): the shipped roles' and tools' main(); the spool's
from_env() constructors (SpoolSource, SpoolProducer, WorldSource), the door a payload run by dflash-launch uses;
a payload that builds its sources by hand calls dflash_launch.use_exit_codes() itself. Importing dflash_launch, or
constructing a source by hand (tests, notebooks, a program with its own exit policy), leaves sys.excepthook alone.
"""
import atexit
import os
import sys


def exit_code_of(error):
    """The exit code `error` asks for (its `exit_code` attribute, an int), or None."""
    code = getattr(error, "exit_code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def use_exit_codes() -> None:
    """From now on an uncaught exception with an `exit_code` ends this process with that code: its traceback
    first (none for code 0: a clean stop such as spool.WarmupSpent, whose words were said when it was raised),
    then os._exit as the interpreter starts to exit. Any other uncaught exception ends it as Python would.
    Idempotent.

    The exit is not taken inside the hook: a hook installed later may wrap this one and hold what it prints until
    it returns (torch.distributed's init_process_group does: it captures stderr to prefix the rank), so the code
    is set by an atexit handler, registered last and so run first, once every hook has said its part; the other
    atexit handlers are skipped (the process is failing anyway, and the code must survive them)."""
    if getattr(sys.excepthook, "dflash_exit_codes", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        code = exit_code_of(value)
        if code != 0:
            previous(kind, value, tb)
        if code is not None:
            atexit.register(_exit_now, code)

    hook.dflash_exit_codes = True
    sys.excepthook = hook


_groups_released_at_exit = []


def release_process_groups_at_exit(dist) -> None:
    """Destroys torch.distributed's groups at exit, while the interpreter is whole, if the program did not. A
    process that ends by an uncaught exception (a rank whose spool failed) otherwise leaves them to the
    interpreter's teardown, where gloo's threads may still hold work with Python references and abort the
    process (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291): the supervisor
    then sees a signal instead of the exit code the rank chose. Registered once, by what binds to a world
    (WorldSource, Checkpoint, init_process_group), so it runs after their own atexit handlers. Idempotent."""
    if _groups_released_at_exit:
        return
    _groups_released_at_exit.append(True)
    atexit.register(_release_process_groups, dist)


def _release_process_groups(dist):
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the process is ending: what is left goes with it
        pass


def end_by_signal(sig) -> None:
    """Ends this process by `sig`'s default action, as a process that got it itself (the supervisor sees the signal
    death it would have seen): how every rank of a world ends on the stop one of them got (Checkpoint). A signal
    whose default action does not end a process (SIGCHLD, SIGCONT, ...) ends it with 128+N, as a shell reports one."""
    import signal
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    _exit_now(128 + int(sig))


def _exit_now(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

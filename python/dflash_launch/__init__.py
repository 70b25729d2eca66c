"""Helpers for payloads run by dflash-launch. The core is standard library only;
torch is imported by the functions that need it, with an error naming the extra
that installs it (`pip install 'dflash-launch[torch]'`: dflash_launch/_extras.py).

- notify_ready() / notify_status(): the systemd notify protocol on $NOTIFY_SOCKET
  (what `ready = "notify"` waits for). No-ops when NOTIFY_SOCKET is unset, so the
  same script runs alone, under dflash-launch, under systemd, or under torchrun.
- check_hidden_states(): the DFlash shape contract. The drafter reads the tapped
  layers concatenated on the feature axis, [batch, seq, n_taps * hidden]; a tensor
  stacked as [batch, seq, n_taps, hidden] is the classic mistake and gets an error
  that shows the reshape that fixes it.
"""

import os
import sys
import socket

from dflash_launch._extras import MissingExtraError, require  # noqa: F401  (MissingExtraError: for callers)
from dflash_launch.exit_codes import use_exit_codes  # noqa: F401  (for payloads that build sources by hand)


# The classes users build, importable from here; imported when first used, so `import dflash_launch` stays standard
# library only (the spool, checkpoint and metrics modules import torch themselves, where a function needs it).
_LAZY = {
    "Checkpoint": "dflash_launch.checkpoint",
    "Stateful": "dflash_launch.stateful",
    "CommitHooks": "dflash_launch.stateful",
    "TrainingMetrics": "dflash_launch.train_metrics",
    "SpoolSource": "dflash_launch.spool",
    "SpoolProducer": "dflash_launch.spool",
    "WorldSource": "dflash_launch.spool",
    "FrameContractError": "dflash_launch.spool",
    "SpoolError": "dflash_launch.spool",
}


def __getattr__(name):
    """dflash_launch.Checkpoint, .SpoolSource, .WorldSource... (_LAZY), imported when first used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dflash_launch' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(module), name)


__version__ = "0.1.0"

__all__ = [
    "notify", "notify_ready", "notify_status", "notify_watchdog", "watchdog_interval",
    "check_hidden_states",
    "check_hidden_shape", "describe_violation", "shape_string", "HiddenStateContractError",
    "contract_from_env", "gate_role", "is_warmup", "init_process_group", "use_exit_codes", "MissingExtraError",
    "share_isa_probe",
    *_LAZY,
]


_said_ready = []  # READY=1 went out from this process (the spool's warm-up budget asks: dflash_launch.spool)


def said_ready() -> bool:
    """True once this process sent READY=1 through notify()/notify_ready()."""
    return bool(_said_ready)


def _compile_facts():
    """What this process's torch compiles with, where the gate must judge it (worker/compile_env_check.h): Dynamo's
    precompile switch and Inductor's cache key tag, read from torch's config modules only if they are loaded
    already (a notify never imports torch). The worker refuses READY when either differs from what the gate's
    processes share entries under: a script or wrapper that sets them escapes every env table."""
    lines = []
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        lines.append("X_DFLASH_PRECOMPILE=" + ("1" if getattr(dynamo, "caching_precompile", False) else "0"))
    compiler = sys.modules.get("torch.compiler.config")
    if compiler is not None:
        tag = str(getattr(compiler, "cache_key_tag", ""))
        if "\n" not in tag:
            lines.append("X_DFLASH_CACHE_KEY_TAG=" + tag)
        # Inductor reads it when it picks its vector ISA, from os.environ: a script that set it there escapes
        # /proc/<pid>/environ ("-": unset).
        capability = os.environ.get("ATEN_CPU_CAPABILITY")
        if capability is None or "\n" not in capability:
            lines.append("X_DFLASH_CPU_CAPABILITY=" + ("-" if capability is None else capability))
    return lines


def notify(message: str) -> bool:
    """Sends one datagram ("KEY=VALUE" lines) to $NOTIFY_SOCKET, with what this process's torch compiles with
    (_compile_facts). False when unset."""
    if "READY=1" in message.split("\n"):
        _said_ready.append(True)
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    message = "\n".join(_compile_facts() + [message])
    if address.startswith("@"):
        address = "\0" + address[1:]  # the abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), address)
    return True


def notify_ready(status: str = None) -> bool:
    """Says "ready": this process has finished compiling (its first compiled step ran)."""
    lines = [f"STATUS={status}"] if status else []
    return notify("\n".join(lines + ["READY=1"]))


def notify_status(text: str) -> bool:
    """A status line the supervisor shows on its console."""
    return notify(f"STATUS={text}")


def notify_watchdog() -> bool:
    """Says "alive" to the role's watchdog (`watchdog = "5m"`): once a process has
    sent one WATCHDOG=1 it must keep sending them within the interval, or it is
    judged hung (SIGABRT, with PYTHONFAULTHANDLER=1 its stacks in its log, then
    SIGKILL) and restarted by policy. A process that never sends one is watched
    by its output and STATUS= lines instead. Call it from the training loop (the
    thread that would hang), not from a timer thread that would outlive a hang."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float:
    """The watchdog interval in seconds ($WATCHDOG_USEC, systemd's name), or 0
    when this process is not watched. Ping at least twice per interval."""
    try:
        return int(os.environ.get("WATCHDOG_USEC", "0")) / 1e6
    except ValueError:
        return 0.0


def gate_role() -> str:
    """"lead" if this process compiles for the others, "reuse" if it loads their
    cache, "" when not gated (DFLASH_GATE_ROLE, set by dflash-worker; in gate mode
    "warmup" by the supervisor: "reuse" for the role's processes that start after
    a warm-up that published READY, "" when it published nothing)."""
    return os.environ.get("DFLASH_GATE_ROLE", "")


def is_warmup() -> bool:
    """True in the warm-up that gate mode "warmup" (or `dflash-launch seed`) runs:
    a world of one that compiles for the role's processes, then is stopped."""
    return os.environ.get("DFLASH_WARMUP") == "1"


def init_process_group(backend: str = "gloo", world: str = "role", fake_world_in_warmup: bool = False, **kwargs):
    """torch.distributed.init_process_group on the world dflash-launch planned for
    this process, and the right thing in a warm-up. Returns (rank, world_size).

    world="role": the role's own world (ROLE_RANK, ROLE_WORLD_SIZE, ROLE_MASTER_PORT);
    world="run": every process of the run (RANK, WORLD_SIZE, MASTER_PORT).

    In a warm-up the launcher sets a world of one with a port of its own, which
    warms the real world for DDP and FSDP2 (their collectives run in hooks,
    outside the compiled graph). A graph with collectives *inside* it
    (functional collectives, e.g. an all_gather whose output shape is the world
    size) compiles differently per world size: pass fake_world_in_warmup=True
    and the warm-up joins torch's fake process group of the real size instead,
    so its graph is the real ranks' graph. The fake group moves no data: use it
    only for code whose warm-up results do not matter (DDP's comm hook fails on
    it, which is why it is not the default)."""
    dist = require("torch.distributed", "init_process_group()")  # lazily: the rest needs no torch

    env = os.environ
    if is_warmup() and fake_world_in_warmup:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        size = int(env.get("DFLASH_RUN_ROLE_WORLD_SIZE" if world == "role" else "DFLASH_RUN_WORLD_SIZE", "1"))
        dist.init_process_group("fake", rank=0, world_size=size, store=FakeStore(), **kwargs)
        return 0, size
    if world == "role":
        addr = env.get("ROLE_MASTER_ADDR") or env["MASTER_ADDR"]
        port, rank, size = env["ROLE_MASTER_PORT"], int(env["ROLE_RANK"]), int(env["ROLE_WORLD_SIZE"])
    elif world == "run":
        addr, port, rank, size = env["MASTER_ADDR"], env["MASTER_PORT"], int(env["RANK"]), int(env["WORLD_SIZE"])
    else:
        raise ValueError(f'world must be "role" or "run", not {world!r}')
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size, **kwargs)
    from dflash_launch.exit_codes import release_process_groups_at_exit
    release_process_groups_at_exit(dist)
    return rank, size


class HiddenStateContractError(ValueError):
    """Hidden states that do not match [batch, seq, n_taps * hidden]."""


def _shape(t):
    return tuple(int(d) for d in t.shape)


def shape_string(shape):
    """"[1, 2000, 25600]"."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def check_hidden_shape(batch, seq_len, n_taps, hidden, shape):
    """None if `shape` is [batch, seq_len, n_taps*hidden]; else (message, expected, found, fix) in the words of
    contract/shape_contract.cc's CheckHiddenShape. tests/fixtures/shape_errors.json pins the wording for both."""
    shape = [int(d) for d in shape]
    width = n_taps * hidden
    want = [batch, seq_len, width]
    if shape == want:
        return None
    expected = (f"{shape_string(want)} = [batch, seq_len, n_taps*hidden]: {n_taps} taps of hidden {hidden} "
                f"concatenated on the feature axis")
    fix = (f"concatenate the taps: torch.cat(taps, dim=-1); a stacked x of shape "
           f"{shape_string([batch, seq_len, n_taps, hidden])} becomes x.reshape({batch}, {seq_len}, {width})")
    if len(shape) == 4 and shape[2] == n_taps and shape[3] == hidden:
        if shape[0] != batch or shape[1] != seq_len:
            fix = "concatenate the taps: torch.cat(taps, dim=-1) or x.flatten(-2) on the stacked tensor"
        return ("taps stacked on a new axis: the drafter's fc reads them concatenated", expected,
                "stacked " + shape_string(shape), fix)
    if len(shape) != 3:
        return "hidden states must be rank 3", expected, f"{shape_string(shape)} (rank {len(shape)})", fix
    if shape[2] != width:
        hint = (f"only one tap's width: concatenate all {n_taps} tapped layers with torch.cat(taps, dim=-1)"
                if shape[2] == hidden else
                f"the feature axis must be n_taps*hidden = {n_taps}*{hidden} = {width}; "
                f"check tapped_layers and hidden in [model]")
        return "feature width does not match the tapped layers", expected, shape_string(shape), hint
    return ("batch or sequence length differs from [model]", expected, shape_string(shape),
            "set [model] batch and seq_len to what the target produces, or pad/crop the samples")


def describe_violation(violation):
    """One line, as contract/shape_contract.cc's DescribeViolation writes it."""
    message, expected, found, fix = violation
    return f"{message}: expected {expected}; found {found}; fix: {fix}"


def check_hidden_states(t, n_taps: int, hidden: int, batch: int = None, seq_len: int = None):
    """Raises HiddenStateContractError unless `t` is [batch, seq, n_taps * hidden] (batch and seq default to
    the tensor's own). The message is the C++ one (check_hidden_shape + describe_violation): a tensor stacked
    as [batch, seq, n_taps, hidden] is recognised and the reshape (or torch.cat) that fixes it is shown.
    Returns `t`."""
    torch = require("torch", "check_hidden_states()")  # lazily: the rest needs no torch

    if not isinstance(t, torch.Tensor):
        raise HiddenStateContractError(f"expected a torch.Tensor, got {type(t).__name__}")
    shape = _shape(t)
    b = batch if batch is not None else (shape[0] if shape else 1)
    s = seq_len if seq_len is not None else (shape[1] if len(shape) > 1 else 0)
    violation = check_hidden_shape(b, s, n_taps, hidden, shape)
    if violation:
        raise HiddenStateContractError(describe_violation(violation))
    return t


def contract_from_env(env=None):
    """The [model] contract dflash-launch passes in DFLASH_* variables, as a dict
    (empty when not run by dflash-launch)."""
    env = os.environ if env is None else env
    if "DFLASH_HIDDEN_SHAPE" not in env:
        return {}
    ints = lambda k, d=0: int(env.get(k, d) or d)
    return {
        "hidden_shape": [int(x) for x in env["DFLASH_HIDDEN_SHAPE"].split(",")],
        "tapped_layers": [int(x) for x in env.get("DFLASH_TAPPED_LAYERS", "").split(",") if x],
        "target_layers": ints("DFLASH_TARGET_LAYERS"),
        "hidden": ints("DFLASH_HIDDEN"),
        "draft_layers": ints("DFLASH_DRAFT_LAYERS", 1),
        "block_size": ints("DFLASH_BLOCK_SIZE", 16),
        "seq_len": ints("DFLASH_SEQ_LEN"),
        "batch": ints("DFLASH_BATCH", 1),
        "dtype": env.get("DFLASH_DTYPE", "fp32"),
        "heads": ints("DFLASH_HEADS"),
        "kv_heads": ints("DFLASH_KV_HEADS"),
        "vocab": ints("DFLASH_VOCAB", 32000),
        "seed": ints("DFLASH_SEED"),
    }


def share_isa_probe() -> bool:
    """In a gated process (DFLASH_GATE_ROLE and the gate's cache dir): Inductor's vector-ISA probe answered from the
    host's records in the cache dir, and this process's own answers recorded for the next (docs/cachelock.md, "The
    ISA probe"). Call it before the first compile (the reference drafter does); it registers one import hook that
    wraps the probe when torch imports it. Elsewhere, or with DFLASH_ISA_SHARE=0, it does nothing and returns False.

    `import dflash_launch` itself never does this: an import patches nothing. Nothing here turns on Dynamo's
    precompile cache (torch._dynamo.config.caching_precompile): with it, torch 2.13 drops identity guards in the
    live process and computes wrong values (docs/cachelock.md, "What is exact")."""
    from dflash_launch.inductor import isa_verdict
    return isa_verdict.install()

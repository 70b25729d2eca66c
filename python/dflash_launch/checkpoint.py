"""Resume, not restart: checkpoints of a training loop, committed together with the spool frames they trained on.

    from dflash_launch import Checkpoint
    ckpt = Checkpoint(model, opt, every_steps=50, source=source)   # on every rank, at the same point
    start = ckpt.restore()                                         # the step to go on from (0: none yet)
    for step, sample in enumerate(source, start):
        loss = ...; loss.backward(); opt.step(); opt.zero_grad()
        sample["ack"](loss)
        ckpt.step(step)                                            # after each step: saves when one is due

Built on torch.distributed.checkpoint: get_state_dict/set_state_dict (a plain module, DDP, FSDP2) and
dcp.async_save, so a step waits only for the copy of the state, not for the disk. A checkpoint is written to
<dir>/.tmp-step-N/ and becomes <dir>/step-N/ by one rename on rank 0 once every rank's part is written (DCP's save
ends with its coordinator gathering every rank's write): a kill at any moment leaves either the whole checkpoint or
none, and the previous one stands. The last `keep` are kept. Each rank's RNG states (torch, CUDA, Python's random,
NumPy's) and its source's position go in a small per-rank file of the same directory.

Anything else it carries (`states=[cursor]`: a data-loader cursor, a sampler) is a dflash_launch.stateful.Stateful,
saved in each rank's file and loaded back; a spool source is a Committing one. With `source` (a WorldSource or
SpoolSource; the same as the first of `states`) an acknowledged frame waits in the spool's pending/ until the
checkpoint covering its step commits, then moves to done/ with that checkpoint's path as its record; restore()
delivers the frames after the checkpoint again, in the same order to the same ranks (WorldSource's fixed order).
So every frame enters the final model exactly once, and on CPU a run killed -9 at any moment ends with the weights
of a run never killed. When the source ends, a last checkpoint commits what is left.

SIGTERM (the supervisor's stop, `ctl stop`, a forwarded preemption) is taken at the next step(): every rank agrees
on it, a checkpoint is written and committed, then the process ends by the same signal. A process that does not
reach its next step within stop.grace is killed as before: the previous checkpoint stands.

The directory: `dir`, else $DFLASH_CHECKPOINT_DIR (dflash-launch: <[run] checkpoint_dir>/<role>), and for a
process outside a torch.distributed world its own subdirectory (DFLASH_PROCESS). A warm-up (DFLASH_WARMUP=1)
neither restores nor saves. docs/checkpoints.md.
"""

import atexit
import copy
import json
import os
import random
import re
import shutil
import signal
import sys
import time

from dflash_launch._extras import require
from dflash_launch import ddp_buckets
from dflash_launch.checkpoint_identity import (ADOPT_VAR, IDENTITY_FILE, frames_said, identity_of, judge,
                                               read_identity, tensor_specs)
from dflash_launch.exit_codes import end_by_signal, release_process_groups_at_exit
from dflash_launch.spool.dirs import private_makedirs
from dflash_launch.stateful import committing

_NAME = re.compile(r"^step-(\d{10})(?:\.(\d+))?$")
# What a rank is doing when it joins one of the Checkpoint's agreements (they carry it, so ranks that took different
# paths meet in one collective and say so, instead of each waiting in a collective of its own).
_STEP, _MOVED, _SAVE = 1, 2, 3
_FLAGS = 5  # the most flags one agreement carries (the step's: due, timed, stop, full, drain)
_PHASES = {_STEP: "the step's agreement (is a checkpoint due?)",
           _MOVED: "the check for anything new since the last checkpoint",
           _SAVE: "the start of a checkpoint's write"}
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_interval(text):
    """Seconds of "500ms", "30s", "10m", "1h" (a number alone: seconds)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"every={text!r}: expected a positive interval such as \"30s\", \"10m\" or \"1h\"")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {sig}"


def _key(name):
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def committed(directory):
    """[(step, path)] of the committed checkpoints in `directory`, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        k = _key(n)
        if k is not None and os.path.exists(os.path.join(directory, n, ".metadata")):
            out.append((k, os.path.join(directory, n)))
    return [(k[0], path) for k, path in sorted(out)]


def _rng_state(torch):
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    return state


def _set_rng_state(torch, state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np = sys.modules.get("numpy")
    if "numpy" in state and np is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def _states_in(extra):
    """{name: state} of a rank file. One written before dflash_launch.stateful held the source's state alone, its
    consumer beside it: read as the source's, the consumer inside (where its commit now looks)."""
    if "states" in extra:
        return extra["states"]
    old = copy.deepcopy(extra.get("source"))
    if old is None:
        return {}
    old.get("source", old).setdefault("consumer", extra.get("consumer"))  # a WorldSource's nests its SpoolSource's
    return {"source": old}


def _same(a, b):
    """a == b for states that may hold tensors (torch.equal: == of tensors is a tensor)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            torch.equal(a, b)
    return a == b


def _error_said(error):
    """One line for a failed load: DCP's CheckpointException by each failed rank's own exception (its text is their
    whole tracebacks), anything else by its type and message."""
    def one(e):
        text = f"{type(e).__name__}: {e}".rstrip(": ").splitlines()[0]
        return text if len(text) <= 160 else text[:157] + "..."  # torch's own advice follows the reason: cut
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"{one(exc)} on rank {r}" for r, (exc, _) in sorted(failures.items()))
    return one(error)


class CheckpointDiverged(RuntimeError):
    """The ranks of a world reached different points of the Checkpoint's protocol (a bug, or a loop that calls
    step()/save()/finish() differently per rank): raised on every rank at once, rather than each waiting forever in a
    collective the others never enter."""


EXIT_CHECKPOINT_REFUSED = 78  # common/exit_codes.h's kCheckpointRefused: the supervisor never restarts it


class CheckpointRefused(RuntimeError):
    """A checkpoint that cannot be restored exactly: another run's, damaged after it committed frames, or one whose
    frames a newer (removed) checkpoint committed. Restarting meets the same checkpoint, so the process ends with
    78 (in a process that opted in to exit codes) and the message says what to do."""
    exit_code = EXIT_CHECKPOINT_REFUSED


class Checkpoint:
    def __init__(self, model, optimizer=None, every_steps=None, every=None, dir=None, keep=3, source=None,
                 async_save=True, stop_signals=(signal.SIGTERM,), stop_wait_s=5.0, metrics=None, say=None, env=None,
                 states=None):
        """`model` (a module, DDP or FSDP2) and `optimizer` (one, a list, or None); a checkpoint every
        `every_steps` steps and/or every `every` ("10m"); `keep` the last ones; `states`: a list (saved by
        position) or a dict (by name) of what else it carries, each a dflash_launch.stateful.Stateful (a data-loader
        cursor) or Committing (a spool source); `source`: the spool source whose frames commit with the
        checkpoints, the same as the first of `states`, named "source". Every rank of a world constructs it at
        the same point (it makes a gloo group for the background writes and one for its agreements when the
        world's backend is not gloo).
        `stop_wait_s`: how long a stop signal waits for the next step() before it ends the process as it would
        have without a Checkpoint (a process blocked elsewhere, e.g. waiting for frames, loses nothing then)."""
        env = os.environ if env is None else env
        self.torch = require("torch", "dflash_launch.Checkpoint")
        self.dist = require("torch.distributed", "dflash_launch.Checkpoint")
        self.dcp = require("torch.distributed.checkpoint", "dflash_launch.Checkpoint")
        if every_steps is not None and int(every_steps) <= 0:
            raise ValueError(f"every_steps={every_steps!r}: expected a positive number of steps")
        self.model, self.source, self.keep, self.async_save = model, source, max(1, int(keep)), bool(async_save)
        # What it carries besides the model and optimizer, by the name each one's state is saved under: one
        # protocol for all (dflash_launch.stateful), so nothing here asks what an object happens to have.
        named = states.items() if isinstance(states, dict) else ((f"states.{i}", x) for i, x in enumerate(states or ()))
        self.states = {"source": committing(source)} if source is not None else {}
        for key, x in named:
            if key in self.states:
                raise ValueError(f"Checkpoint: two states named {key!r}")
            self.states[str(key)] = committing(x)
        self.optimizers = [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) \
            else [optimizer]
        self.every_steps = int(every_steps) if every_steps else None
        self.every_s = parse_interval(every) if every is not None else None
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.metrics = metrics if metrics is not None else next(
            (x.metrics for x in self.states.values() if x.metrics is not None), None)
        self.warmup = env.get("DFLASH_WARMUP") == "1"
        self.process = env.get("DFLASH_PROCESS", "")
        self.env = env                              # whose checkpoints these are (checkpoint_identity)
        self.adopt = env.get(ADOPT_VAR) == "1"      # another run's checkpoint, taken on purpose
        self.in_world = self.dist.is_available() and self.dist.is_initialized() and not self.warmup
        self.rank = self.dist.get_rank() if self.in_world else 0
        self.world = self.dist.get_world_size() if self.in_world else 1
        base = dir or env.get("DFLASH_CHECKPOINT_DIR")
        if not base and not self.warmup:
            raise ValueError("Checkpoint: no directory: pass dir=..., or run under dflash-launch, which sets "
                             "DFLASH_CHECKPOINT_DIR (<[run] checkpoint_dir>/<role>)")
        self.dir = os.path.abspath(str(base)) if base else None
        if self.dir and not self.in_world and self.process and not dir:
            self.dir = os.path.join(self.dir, self.process)  # a role's processes outside a world: one each
        self.agree_group = self.save_group = None
        if self.in_world:
            # The background writes run collectives of their own: on a group of their own, never interleaved
            # with the loop's (the step's all-reduce, the agreements below).
            self.save_group = self.dist.new_group(backend="gloo")
            self.agree_group = None if "gloo" in str(self.dist.get_backend()) else self.dist.new_group(backend="gloo")
            release_process_groups_at_exit(self.dist)  # registered first: the world's groups go after ours
            atexit.register(self._release_groups)
        for x in self.states.values():
            x.attached(self.finish)
        self.done_steps = 0
        self.resumed_from = None
        self.last = None              # (step, path) of the last committed checkpoint
        self._last_states = None      # this rank's states in it (in memory: see _states_moved)
        self.saved = 0
        self.save_blocked_s = 0.0     # what the steps waited for saves (the copy; the disk too when not async)
        self._inflight = None
        self._last_save_t = time.monotonic()
        self._stop = None
        self._old_handlers = {}
        self._stop_signals = tuple(stop_signals or ())
        self._stop_wait_s = float(stop_wait_s)
        self._stop_timer = None
        self._said_full = False

    # Where ----------------------------------------------------------------------------------------------------

    def _rank_file(self, path, rank):
        return os.path.join(path, f"rank-{rank:05d}.pt")

    def _broadcast(self, obj):
        if not self.in_world:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=0, group=self.agree_group)
        return box[0]

    # Restore ---------------------------------------------------------------------------------------------------

    def restore(self):
        """Loads the last committed checkpoint (model, optimizer, RNG states, the source's position) and returns
        the step to go on from; 0 when there is none. Rank 0 removes what a killed save left half-written.

        Refused (CheckpointRefused, exit 78 where the process opted in to exit codes; every rank raises it) when
        the restore cannot be exact: another run's checkpoint (unless DFLASH_CHECKPOINT_ADOPT=1), another [model],
        world size or tensor dtype/shape, or frames done/ credits to a checkpoint newer than the one it would
        restore (removed, or damaged: docs/checkpoints.md, "Identity" and "A restore that cannot be exact")."""
        self._install_signals()
        if self.warmup:
            return 0
        torch = self.torch
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: named to be caught
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        msd, osd = get_state_dict(self.model, self.optimizers)
        mine = identity_of(self.env, self.world, self._identity(), tensor_specs({"model": msd, "optim": osd}))
        if self.rank == 0:
            private_makedirs(self.dir)
            for n in os.listdir(self.dir):
                if n.startswith(".tmp-"):
                    shutil.rmtree(os.path.join(self.dir, n), ignore_errors=True)  # a kill mid-write
        records = self._records() if self.rank == 0 else {}
        while True:
            choice = self._broadcast(self._choose(mine, records) if self.rank == 0 else None)
            if choice[0] == "refuse":
                raise CheckpointRefused(f"{self._who()}: {choice[1]}")  # on every rank: none waits in a collective
            if choice[0] == "none":
                for x in self.states.values():
                    x.start_over()
                self.say(f"{self._who()}: no checkpoint in {self.dir}: starting at step 0")
                self._report(resumed_from_step=0)  # the run's summary: a restart with none yet redoes every step
                return 0
            _, step, path, verdict, same_spool, why, oldest = choice
            t0 = time.monotonic()
            error = None
            try:
                msd, osd = get_state_dict(self.model, self.optimizers)
                state = {"model": msd, "optim": osd}
                if oldest:  # DCP loads in place: a failed load must leave the model as built, with none to fall back on
                    state = copy.deepcopy(state)
                self.dcp.load(state, checkpoint_id=path, process_group=self.save_group)
                extra = torch.load(self._rank_file(path, self.rank), weights_only=True)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 - damaged: every rank learns it below
                error = _error_said(e)
            errors = self._gather(error)
            if not any(errors):
                break
            # Damaged: an older one only if this one committed no frames (else they would train twice).
            verdict_of_damage = self._damaged(path, errors, records) if self.rank == 0 else None
            verdict_of_damage = self._broadcast(verdict_of_damage)
            if verdict_of_damage[0] == "refuse":
                raise CheckpointRefused(f"{self._who()}: {verdict_of_damage[1]}")
            self.say(f"{self._who()}: {verdict_of_damage[1]}")
        set_state_dict(self.model, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
        _set_rng_state(torch, extra["rng"])
        buckets_kept = ddp_buckets.apply(self.model, extra.get("ddp_buckets"))
        if buckets_kept:
            self.say(f"{self._who()}: DDP's gradient buckets stay as built: {buckets_kept}; the resumed steps sum in "
                     f"another order than the run it resumes (exactly once, not bitwise)")
        if verdict == "adopt":
            self.say(f"{self._who()}: {why}")
            self._report(checkpoint_adopted=path)
        saved = _states_in(extra)
        missing = sorted(k for k, x in self.states.items() if k not in saved and (same_spool or not x.identity))
        if missing:
            raise CheckpointRefused(f"{self._who()}: checkpoint {path} holds no state for {', '.join(missing)} "
                                    f"(it holds {', '.join(sorted(saved)) or 'none'}): a state added since it was "
                                    f"written cannot resume exactly; give it the name it had, or start another run")
        every = self._every_rank_states(path) if self.rank == 0 and self.states else {}
        for key, x in self.states.items():
            if x.identity and not same_spool:
                x.start_over()  # adopted from another spool: its place there means nothing here
                continue
            if self.rank == 0:
                x.checkpoint_committed(every[key], path)  # the kill may have come between its rename and this
            x.load_state_dict(saved[key])
        self.done_steps = self.resumed_from = int(extra["step"])
        self.last = (self.resumed_from, path)
        self._last_states = copy.deepcopy(saved) if same_spool else None
        self._last_save_t = time.monotonic()
        took = time.monotonic() - t0
        self.say(f"{self._who()}: resumed from step {self.resumed_from} ({path}, {took:.2f}s)")
        self._report(resumed_from_step=self.resumed_from, restore_s=round(took, 3),
                     checkpoint={"path": path, "step": self.resumed_from},
                     last_checkpoint_unix=round(os.stat(path).st_mtime, 3))  # its age: from when it was written
        if self.metrics is not None:
            self.metrics.write()  # at once: the live metrics show the resume before a first step (a compile) ends
        return self.resumed_from

    def _identity(self):
        """What the carried states consume (the spool's root), for the checkpoint's identity ("" for none)."""
        return ",".join(x.identity for x in self.states.values() if x.identity)

    def _records(self):
        """{frame: checkpoint} of the spool's done/ records that name a checkpoint of this directory (rank 0)."""
        here, same = os.path.realpath(self.dir), {}
        out = {}
        records = {}
        for x in self.states.values():
            records.update(x.committed_records())
        for f, ck in records.items():
            parent = os.path.dirname(ck)
            if parent not in same:  # the path the writer used may reach this dir another way (a link)
                same[parent] = parent == self.dir or os.path.realpath(parent) == here
            if same[parent]:
                out[f] = os.path.join(self.dir, os.path.basename(ck))
        return out

    def _choose(self, mine, records):
        """Rank 0: what restore() does, for every rank: ("none",), ("refuse", why) or ("load", step, path, verdict,
        same_spool, why) of the newest committed checkpoint (judge() on its identity)."""
        found = committed(self.dir)
        ok = [(s, p) for s, p in found if all(os.path.exists(self._rank_file(p, r)) for r in range(self.world))]
        if found and not ok:
            return ("refuse", f"checkpoint {found[-1][1]} was written by a world of another size (it lacks rank "
                              f"files for {self.world} ranks); restore it with that many ranks, or use another "
                              f"checkpoint dir")
        newest = _key(os.path.basename(ok[-1][1])) if ok else None
        # Frames done/ credits to a checkpoint newer than the one at hand (or to one when there is none): they
        # entered a model this restore would not have, and would train again (or, in a fixed order, be missing).
        ahead = {f: ck for f, ck in records.items() if newest is None or _key(os.path.basename(ck)) > newest}
        if ahead:
            return ("refuse", self._ahead_said(ahead, ok[-1][1] if ok else None))
        if not ok:
            return ("none",)
        step, path = ok[-1]
        theirs = read_identity(path)
        if isinstance(theirs, str):  # damaged like a .distcp that does not load: the same rule
            damage = self._damaged(path, [theirs], records)
            if damage[0] == "refuse":
                return damage
            self.say(f"{self._who()}: {damage[1]}")
            return self._choose(mine, records)
        verdict, same_spool, why = judge(mine, theirs, self.adopt, path)
        if verdict == "refuse":
            return ("refuse", why)
        return ("load", step, path, verdict, same_spool, why, len(ok) == 1)

    def _ahead_said(self, ahead, restorable):
        by = {}
        for f, ck in ahead.items():
            by.setdefault(ck, []).append(f)
        named = "; ".join(f"{os.path.basename(ck)} ({'in ' + self.dir if os.path.isdir(ck) else 'gone'}) committed "
                          f"{len(fs)}: {frames_said(fs)}" for ck, fs in sorted(by.items()))
        here = f"the newest it can restore is {restorable}" if restorable else f"{self.dir} holds none"
        return (f"the spool's done/ records credit frames to checkpoints newer than what this restore can take "
                f"({here}): {named}. Those frames entered a model no checkpoint here holds; resuming would train "
                f"them again or skip them, never exactly. Fix: put the checkpoint that committed them back "
                f"(never remove the newest checkpoint to resume from the one before), or start over with a fresh "
                f"run (a new run id: a new spool) and another [run] checkpoint_dir")

    def _damaged(self, path, errors, records):
        """Rank 0, after `path` failed to load on some rank (`errors`: each rank's, or None): ("refuse", why) if
        done/ credits frames to it, else ("skip", what was done) having moved it aside (damaged-step-N), so the
        next choice is the one before it and no later save meets its name."""
        said = "; ".join(dict.fromkeys(e for e in errors if e))  # DCP's error is every rank's: said once
        if len(said) > 2000:
            said = said[:2000] + " ..."
        mine = sorted(f for f, ck in records.items() if ck == path)
        if mine:
            return ("refuse", f"checkpoint {path} cannot be loaded ({said}), and the spool's done/ records credit "
                              f"{len(mine)} frames to it ({frames_said(mine)}): an older checkpoint would train "
                              f"them again. Fix: put back an intact copy of {path}, or start over with a fresh run "
                              f"(a new run id: a new spool) and another [run] checkpoint_dir")
        aside, n = os.path.join(self.dir, "damaged-" + os.path.basename(path)), 1
        while os.path.lexists(aside):  # an earlier one of the same name: both kept (.2, .3, as the builtin does)
            n += 1
            aside = os.path.join(self.dir, f"damaged-{os.path.basename(path)}.{n}")
        os.rename(path, aside)
        return ("skip", f"checkpoint {path} cannot be loaded ({said}); it committed no frames, so the one before it "
                        f"is exact: moved to {aside}, trying the next")

    def _gather(self, value):
        """Every rank's `value` (picklable), in rank order; [value] outside a world."""
        if not self.in_world:
            return [value]
        every = [None] * self.world
        self.dist.all_gather_object(every, value, group=self.agree_group)
        return every

    def _every_rank_states(self, path):
        """{name: [every rank's state, in rank order]} as the checkpoint at `path` recorded them (rank 0: what
        each state's checkpoint_committed is given)."""
        out = {key: [] for key in self.states}
        for r in range(self.world):
            saved = _states_in(self.torch.load(self._rank_file(path, r), weights_only=True))
            for key in out:
                out[key].append(saved.get(key))
        return out

    # Save ------------------------------------------------------------------------------------------------------

    def step(self, step):
        """After step `step` (0-based) ran: saves a checkpoint when one is due (every_steps, every), or when a
        stop signal came (then writes it, waits for it, and ends the process by that signal)."""
        self.done_steps = int(step) + 1
        if self.warmup:
            return
        for x in self.states.values():
            x.step_ended()  # the step's frame is covered by a checkpoint from here on
        self._poll()
        due = bool(self.every_steps and self.done_steps % self.every_steps == 0)
        timed = self.every_s is not None and time.monotonic() - self._last_save_t >= self.every_s
        got_signal = self._stop is not None
        level = self._pending_level()
        full = level > 1 and self._inflight is None  # a checkpoint now commits them
        drain = level > 2 and self._inflight is not None  # still more while one is in flight: wait for its commit
        # Every rank decides the same: the clocks, the signals' arrival and the frames held differ. The stop carries
        # its signal's number: a rank that got none ends by the world's (one rank's stop is the world's stop).
        due, timed, stop, full, drain = self._agree(_STEP, due, timed, self._stop or 0, full, drain)
        if stop:
            self._stop = stop  # also keeps a later signal (the supervisor's own stop, say) from arming a timer
        if drain:
            t0 = time.monotonic()
            self._wait_inflight()
            self.save_blocked_s += time.monotonic() - t0
        if stop and self._stop_timer is not None:
            self._stop_timer.cancel()  # this step takes it: the checkpoint, then the signal
        if full and not (due or timed or stop) and not self._said_full:
            self._said_full = True
            self.say(f"{self._who()}: a checkpoint at step {self.done_steps}, before its interval: the frames "
                     f"waiting for it hold more than their share of the spool's byte budget (once a checkpoint "
                     f"commits them their bytes go; a shorter interval saves these early ones)")
        if due or timed or stop or full:
            self.save(wait=stop)
        if stop:
            self._end_by_signal(got_signal)

    def save(self, wait=False):
        """A checkpoint of the steps done so far (every rank at once). Async unless `wait` or async_save=False:
        it commits at a later step(), or at the next save, finish() or restore's end."""
        if self.warmup:
            return
        torch, dcp = self.torch, self.dcp
        t0 = time.monotonic()
        self._wait_inflight()
        step = self.done_steps
        name = f"step-{step:010d}"
        if self.last is not None and self.last[0] == step:
            if not self._states_moved():
                return  # nothing new since that checkpoint
            name += f".{_key(os.path.basename(self.last[1]))[1] + 1}"  # the tail's frames after it (tail="drop")
        tmp, final = os.path.join(self.dir, ".tmp-" + name), os.path.join(self.dir, name)
        self._agree(_SAVE)  # every rank writes this one: DCP's collectives follow
        private_makedirs(tmp)  # every rank: 0700 from the checkpoint dir down, whoever makes it first
        states = {key: x.state_dict() for key, x in self.states.items()}
        extra = {"step": step, "rank": self.rank, "world": self.world, "rng": _rng_state(torch), "states": states,
                 "ddp_buckets": ddp_buckets.layout(self.model)}  # the resumed DDP sums as this one (ddp_buckets)
        torch.save(extra, self._rank_file(tmp, self.rank))
        states = copy.deepcopy(states)  # as saved: a state the loop changes in place later is no witness
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(self.model, self.optimizers)
        state = {"model": msd, "optim": osd}
        if self.rank == 0:  # whose it is: restore() takes only this run's (checkpoint_identity)
            identity = identity_of(self.env, self.world, self._identity(), tensor_specs(state))
            with open(os.path.join(tmp, IDENTITY_FILE), "w") as f:
                json.dump(identity, f)
                f.flush()
                os.fsync(f.fileno())  # on disk before the rename commits it, as DCP's files are
        if self.async_save and not wait:
            future = dcp.async_save(state, checkpoint_id=tmp, process_group=self.save_group)
            future = getattr(future, "upload_completion", future)
        else:
            dcp.save(state, checkpoint_id=tmp, process_group=self.save_group)
            future = None
        self._inflight = (step, tmp, final, states, future)
        self._last_save_t = time.monotonic()
        if future is None:
            self._commit()
        self.save_blocked_s += time.monotonic() - t0

    def _pending_level(self):
        """The bytes of the frames this rank acknowledged into pending/ over its share of the spool's byte budget
        (SpoolSource.pending_level). Frames wait there for the checkpoint covering them outside the producers'
        budget (counting them would stop the producers before the world reaches that checkpoint), so without a
        bound an interval of many large frames could fill the spool's filesystem (600 frames of 102 MB at every
        200 steps in a world of 3). Over 1: a checkpoint now; over 2 while one is in flight (steps outrun an async
        save): the step waits for its commit."""
        return max((float(x.pending_level()) for x in self.states.values()), default=0.0)

    def _states_moved(self):
        """Did a carried state change since the last checkpoint (a source with tail="drop": frames acknowledged
        without a step)? From this rank's own record of that checkpoint, in memory: its files are no witness, since
        rank 0 renames the checkpoint into place after every peer's save has returned, and a peer that looked first
        once found nothing and took another path than the world (issue #45's hang). Every rank joins the
        agreement."""
        moved = False
        if self.states:
            now = {key: x.state_dict() for key, x in self.states.items()}
            moved = self._last_states is None or not _same(now, self._last_states)
        (moved,) = self._agree(_MOVED, moved)
        return moved

    def _agree(self, phase, *flags):
        """`flags` (bools, or non-negative ints such as a signal's number), each the largest over the world (an OR
        for bools), in one all_gather that also carries where each rank is (`phase`, the step): ranks that reached
        different points raise CheckpointDiverged together instead of waiting in different collectives. Outside a
        world: `flags` as given."""
        if not self.in_world:
            return [int(f) for f in flags]
        torch = self.torch
        # One size for every phase (gloo needs equal sizes to match two ranks' calls at all).
        values = [phase, self.done_steps] + [int(f) for f in flags] + [0] * (_FLAGS - len(flags))
        mine = torch.tensor(values, dtype=torch.int64)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        self.dist.all_gather(every, mine, group=self.agree_group)
        where = [(int(t[0]), int(t[1])) for t in every]
        if len(set(where)) != 1:
            said = "; ".join(f"rank {r}: {_PHASES.get(p, f'phase {p}')} at step {s}" for r, (p, s) in enumerate(where))
            raise CheckpointDiverged(f"{self._who()}: the ranks of the world are at different points of the "
                                     f"checkpoint protocol ({said}); each would wait forever for the others. Every "
                                     f"rank must call step(), save() and finish() at the same points")
        return [int(v) for v in torch.stack(every)[:, 2:2 + len(flags)].amax(0).tolist()]

    def _poll(self):
        if self._inflight is not None and self._inflight[4] is not None and self._inflight[4].done():
            self._commit()

    def _wait_inflight(self):
        if self._inflight is not None:
            self._commit()

    def _commit(self):
        """The save in flight finished on this rank: rank 0 (whose save ended after every rank's part was
        written) renames it into place, commits the frames it covers and drops the oldest beyond `keep`."""
        step, tmp, final, states, future = self._inflight
        self._inflight = None
        if future is not None:
            future.result()  # a failed write raises here
        self.saved += 1
        self.last, self._last_states = (step, final), states
        # last_checkpoint_unix: the live run's dflash_training_checkpoint_age_seconds (docs/metrics.md).
        self._report(checkpoint={"path": final, "step": step}, checkpoints_written=self.saved,
                     checkpoint_blocked_s=round(self.save_blocked_s, 3), last_checkpoint_unix=round(time.time(), 3))
        if self.metrics is not None:
            self.metrics.write()  # at once (a commit is rare): the run's summary knows a killed rank got this far
        if self.rank != 0:
            return
        os.rename(tmp, final)
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)  # the rename is the commit: on disk before the frames are
        finally:
            os.close(fd)
        every = self._every_rank_states(final) if self.states else {}
        for key, x in self.states.items():
            x.checkpoint_committed(every[key], final)
        for _, old in committed(self.dir)[:-self.keep]:
            # Out of the committed names first: a kill mid-removal leaves a .tmp-* that restore() removes, never a
            # step-N without its .metadata, which no later prune would see.
            doomed = os.path.join(self.dir, ".tmp-old-" + os.path.basename(old))
            shutil.rmtree(doomed, ignore_errors=True)  # a leftover of the same name (restore() removes them)
            os.rename(old, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def _release_groups(self):
        """At exit, while the interpreter is whole: destroys this Checkpoint's own gloo groups and drops them. Kept
        alive by this object past the world's destroy_process_group, they were destroyed at the interpreter's
        teardown, where gloo's threads may still hold work with Python references and abort the process after
        its work is done (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291)."""
        groups = [g for g in (self.save_group, self.agree_group) if g is not None]
        self.save_group = self.agree_group = None
        for g in groups:
            try:
                self.dist.destroy_process_group(g)
            except Exception:  # noqa: BLE001 - already destroyed with the world: nothing left to release
                pass

    def finish(self):
        """A last checkpoint of every step done (the source calls it when it ends), waited for and committed."""
        if self.warmup:
            return
        self.save(wait=True)
        self._uninstall_signals()

    # Stop signals ----------------------------------------------------------------------------------------------

    def _install_signals(self):
        import threading
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self._stop_signals:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _uninstall_signals(self):
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def _on_signal(self, signum, frame):
        if self._stop is not None:
            return
        self._stop = signum  # taken at the next step(): every rank agrees, checkpoints, then ends by it
        import threading
        self._stop_timer = threading.Timer(self._stop_wait_s, self._die_by, args=(signum,))
        self._stop_timer.daemon = True
        self._stop_timer.start()

    def _die_by(self, sig):
        """No step() came in time (the process waits elsewhere): end by the signal, as without a Checkpoint."""
        self.say(f"{self._who()}: {_signal_name(sig)}: no step within {self._stop_wait_s:g}s; stopping "
                 f"without a checkpoint (the last one stands)")
        # From this thread signal.signal() is refused (main thread only) and the main thread may sit in C code:
        # the kernel's disposition goes back to the default through libc itself, then the signal is raised.
        import ctypes
        ctypes.CDLL(None).signal(int(sig), ctypes.c_void_p(0))  # SIG_DFL
        os.kill(os.getpid(), sig)

    def _end_by_signal(self, got_it=True):
        """Ends the process by the world's agreed stop signal, as a rank that got it itself: its default action (a
        signal death the supervisor sees as such), on the ranks that got no signal too (`got_it` False)."""
        sig = self._stop
        whose = "" if got_it else " (another rank's: the world stops together)"
        self.say(f"{self._who()}: {_signal_name(sig)}: checkpoint at step {self.done_steps} committed "
                 f"({self.last[1] if self.last else '-'}); stopping{whose}")
        if self.metrics is not None:
            self.metrics.write()
        self._uninstall_signals()
        end_by_signal(sig)

    # Reporting -------------------------------------------------------------------------------------------------

    def _who(self):
        return self.process or f"rank {self.rank}"

    def _report(self, **fields):
        if self.metrics is not None:
            self.metrics.update(**fields)

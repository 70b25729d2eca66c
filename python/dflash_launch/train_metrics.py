"""What a training process reports for the run summary: steps, the loss from first to last, the time to its first
step, and whatever else it adds (the spool's frames). dflash-launch reads $DFLASH_METRICS_FILE when the process
ends and shows these keys for every process that has them, whatever its script (the "training" table of the
run's summary, summary.json's `metrics`, and <run_dir>/loss.svg; docs/summary-json.md).

    from dflash_launch.train_metrics import TrainingMetrics
    metrics = TrainingMetrics()            # $DFLASH_METRICS_FILE; nothing is written without it
    for sample in source:
        loss = step(sample)
        metrics.step(loss)                 # a float or a 0-dim tensor
    metrics.write()

dflash_launch.spool.world.WorldSource does this by itself: `sample["ack"](loss)`.

The keys: `steps`, `first_loss`, `last_loss`, `first_loss_mean10` and `last_loss_mean10` (the mean of the
first and of the last 10 losses, from 20 steps on), `losses` (the curve: every `loss_stride`-th loss, at most
MAX_POINTS of them, so a long run's file stays small), `time_to_first_step_s` (from the process's start, as the
kernel counts it, to the end of its first step: imports, model load and compile included), `wall_s`, and
torch.compile's cache counters when the process compiled (`fxgraph_cache_hit`/`_miss`, `autograd_cache_hit`/`_miss`,
`dynamo_cache_hit`/`_miss`: what `seed --verify` and the summary's hit/miss columns read). The file is written at
the first step too, so a warm-up stopped once ready still leaves its counters.
`checkpoint()` after a checkpoint is saved adds `last_checkpoint_unix`: the live run's metrics show its age
(docs/metrics.md; dflash_launch.Checkpoint writes it at each commit and restore). With `resumed_from_step` (a
Checkpoint's restore writes it) the file carries `global_step`: that step plus this attempt's steps. One writer per process: a script with more to say adds it with update(), which keeps one file."""

import atexit
import collections
import json
import os
import sys
import time

#: The most points `losses` keeps: past it every other one goes and the stride doubles.
MAX_POINTS = 2000
#: Steps averaged at each end for `first_loss_mean10` / `last_loss_mean10` (a single step's loss is noise).
MEAN_STEPS = 10
WRITE_SHARE = 50  # a write at most every 50 writes' time between steps: <= 2 % of a step on the file


def process_age_s():
    """Seconds since this process started (/proc/self/stat's starttime against /proc/uptime)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: after comm's ")" it is the 20th
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def write_json_private(path, data):
    """`data` as JSON at `path`, atomically (a temp file renamed over it), 0600, never through a link."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def compile_counters():
    """torch.compile's cache counters of this process ({} if it never imported torch._dynamo; never imports it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return {}
    ind, aot, dyn = counters["inductor"], counters["aot_autograd"], counters["dynamo_cache"]
    return {"fxgraph_cache_hit": int(ind["fxgraph_cache_hit"]), "fxgraph_cache_miss": int(ind["fxgraph_cache_miss"]),
            "fxgraph_cache_bypass": int(ind["fxgraph_cache_bypass"]),
            "autograd_cache_hit": int(aot["autograd_cache_hit"]), "autograd_cache_miss": int(aot["autograd_cache_miss"]),
            "dynamo_cache_hit": int(dyn["dynamo_cache_hit"]), "dynamo_cache_miss": int(dyn["dynamo_cache_miss"])}


class TrainingMetrics:
    def __init__(self, path=None, every_s=5.0, **fields):
        """`path` defaults to $DFLASH_METRICS_FILE (none: nothing is written). The file is rewritten at most
        every `every_s` seconds while steps come (more often while a write costs under 2 % of the time between them), by
        write(), and once more at exit."""
        self.path = os.environ.get("DFLASH_METRICS_FILE", "") if path is None else path
        self.every_s = every_s
        self.data = dict(fields)
        self.steps, self.stride, self.losses = 0, 1, []
        self.first_loss = self.last_loss = None
        self.first_few, self.last_few, self._losses_seen = [], collections.deque(maxlen=MEAN_STEPS), 0
        self.t0 = time.monotonic() - process_age_s()
        self._last_write = time.monotonic()
        # What the last few writes took: the fastest of them paces the next (a loaded machine makes some slower; the
        # file grows with the curve, so an old fast write would understate the cost). None yet: only every_s.
        self._write_costs = collections.deque(maxlen=8)
        if self.path:
            atexit.register(self.write)

    def step(self, loss=None):
        """One training step ended; `loss` (a number or a one-element tensor) goes into the curve."""
        if self.steps == 0:
            self.data["time_to_first_step_s"] = round(time.monotonic() - self.t0, 3)
        if loss is not None:
            # detach(): float() of a tensor that requires grad warns (torch >= 2.6), once per process, and
            # sample["ack"](loss) -- the documented pattern -- passes exactly such a tensor.
            value = round(float(loss.detach() if hasattr(loss, "detach") else loss), 5)
            if self.first_loss is None:
                self.first_loss = value
            self.last_loss = value
            if len(self.first_few) < MEAN_STEPS:
                self.first_few.append(value)
            self.last_few.append(value)
            self._losses_seen += 1
            if self.steps % self.stride == 0:
                self.losses.append(value)
                if len(self.losses) > MAX_POINTS:
                    self.losses, self.stride = self.losses[::2], self.stride * 2
        self.steps += 1
        # The first step ends the compile: its counters are on disk before anything can stop the process. Then every
        # `every_s`, and sooner while a write costs under 2 % of the time between them (every step of a step that
        # takes 50 writes' time): the step a killed process had reached is what the run's summary tells.
        since = time.monotonic() - self._last_write
        cost = min(self._write_costs, default=float("inf"))
        if self.steps == 1 or since >= self.every_s or since >= WRITE_SHARE * cost:
            self.write()

    def update(self, **fields):
        """Adds keys of the caller's own (they never replace steps, losses or the time to the first step)."""
        self.data.update(fields)

    def checkpoint(self, when=None):
        """A checkpoint was saved (now, or at `when`, seconds since the epoch): the run's metrics show its age
        (dflash_training_checkpoint_age_seconds, docs/metrics.md). Written at once: a checkpoint is rare."""
        self.data["last_checkpoint_unix"] = round(time.time() if when is None else float(when), 3)
        self.write()

    def snapshot(self):
        out = {**compile_counters(), **self.data}  # the script's own counters (update()) win
        out.update(steps=self.steps, first_loss=self.first_loss, last_loss=self.last_loss, losses=list(self.losses),
                   loss_stride=self.stride, wall_s=round(time.monotonic() - self.t0, 3))
        resumed = self.data.get("resumed_from_step")
        if isinstance(resumed, int) and "global_step" not in self.data:  # a Checkpoint's restore said where from
            out["global_step"] = resumed + self.steps
        if self._losses_seen >= 2 * MEAN_STEPS:  # two windows that do not overlap
            out.update(first_loss_mean10=round(sum(self.first_few) / MEAN_STEPS, 5),
                       last_loss_mean10=round(sum(self.last_few) / MEAN_STEPS, 5))
        return out

    def write(self):
        """Writes the file now (no-op without a path)."""
        t0 = self._last_write = time.monotonic()
        if self.path:
            write_json_private(self.path, self.snapshot())
            self._write_costs.append(time.monotonic() - t0)

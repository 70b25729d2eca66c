"""The Python tests' support module: run dflash-launch on a throw-away config, read what it left, and
wait for events with a deadline.

Tests never sleep to let something happen: they wait for the event itself (a file a payload writes,
a log line, a gate record) with `wait_until`, whose timeout is a hang detector, not a speed
assertion. Where a test must show that something does NOT happen, `holds_for` watches for a window
stated in the test (with why it is long enough)."""
import json
import os
import pathlib
import signal
import subprocess
import textwrap
import time

# How long a test waits for an event that normally takes milliseconds to a few seconds: a hang
# detector. A loaded machine must never fail a test by being slow.
EVENT_TIMEOUT = 60.0

# The reference drafter's small shapes (hidden 64, 2 blocks): real torch.compile in seconds on a CPU. The gate
# tests and the compile benchmarks use the same model, so their numbers speak of the same compile.
SMALL_MODEL = """
[model]
target_layers = 64
hidden = 64
tapped_layers = [1, 16, 31, 46, 61]
draft_layers = 2
block_size = 4
seq_len = 64
dtype = "fp32"
heads = 4
kv_heads = 2
vocab = 256
"""


def write_config(dir, body, name="t"):
    """A config in `dir` with its cache and logs inside it; `body` holds the [[role]]s."""
    dir = pathlib.Path(dir)
    (dir / "cache").mkdir(mode=0o700, exist_ok=True)
    path = dir / "run.toml"
    path.write_text(textwrap.dedent(f"""\
        [run]
        name = "{name}"
        cache_dir = "cache"
        log_dir = "runs"
        """) + textwrap.dedent(body))
    return path


def run_to_the_end(bin_dir, cfg, env, timeout):
    """A whole run of `cfg` that must exit 0 (for a module-scoped fixture: `launch` is per test); killed if not."""
    r = Run(bin_dir, cfg, env=env)
    try:
        assert r.wait(timeout=timeout) == 0, r.out[-4000:] + r.err[-2000:]
    finally:
        r.kill()
    return r


class Run:
    """dflash-launch run CONFIG in the background."""

    def __init__(self, bin_dir, config, run_id="r", env=None, args=()):
        self.config = pathlib.Path(config)
        self.run_id = run_id
        self.run_dir = self.config.parent / "runs" / run_id
        self.proc = subprocess.Popen(
            [str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", run_id, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)
        self.out = self.err = ""

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout=120):
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def summary(self):
        return json.loads((self.run_dir / "summary.json").read_text())

    def wait_for_log(self, text, timeout=EVENT_TIMEOUT, count=1):
        """Until the supervisor's log file has `text` (its own lines: states, reasons) `count` times."""
        exited = []

        def logged():
            if self.count_in_log(text) >= count:
                return True
            if self.proc.poll() is not None:
                exited.append(True)
                return True
            return False

        assert wait_until(logged, timeout), f"{text!r} not logged {count}x within {timeout}s"
        if exited and self.count_in_log(text) < count:
            raise AssertionError(f"supervisor exited before logging {text!r} {count}x")

    def count_in_log(self, text):
        log = self.run_dir / "supervisor.log"
        return log.read_text().count(text) if log.exists() else 0

    def state_of(self, name):
        """The state the supervisor's log last moved `name` to (STARTING, RUNNING, ...)."""
        log = self.run_dir / "supervisor.log"
        state = None
        for line in (log.read_text().splitlines() if log.exists() else []):
            if f" {name} " in line and " -> " in line:
                state = line.split(" -> ", 1)[1].split()[0].rstrip(":")
        return state

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def proc_table():
    """pid -> (ppid, state, cmdline) of every process now."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            rest = stat[stat.rindex(")") + 2:].split()
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            out[int(d)] = (int(rest[1]), rest[0], cmd)
        except (OSError, ValueError):
            pass
    return out


def descendants(root):
    """Live pids below `root` (children, grandchildren, ...)."""
    table = proc_table()
    found, frontier = set(), {root}
    while frontier:
        nxt = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= nxt
        frontier = nxt
    return found


def alive_with_marker(marker, payloads_only=False):
    """Live pids whose command line holds `marker` (a unique string in a test's
    payloads): the payloads and, unless `payloads_only`, their dflash-workers."""
    return [pid for pid, (_, state, cmd) in proc_table().items()
            if marker in cmd and state != "Z" and not (payloads_only and "dflash-worker" in cmd)]


def wait_until(pred, timeout=EVENT_TIMEOUT, step=0.02):
    """Polls `pred` until it holds or `timeout` passes; its last answer (so an event that came just
    at the deadline still counts). A monotonic clock: a wall-clock step cannot cut a wait short."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def stopped_when(pid, pred, timeout=EVENT_TIMEOUT):
    """SIGSTOPs `pid` at a moment `pred` holds, asked while every thread of it is stopped (so the moment lasts
    until the caller acts): True, the process left stopped for the caller to kill or SIGCONT; False, running,
    when no such moment came within `timeout`. For a kill that must land in a state, not near it."""
    def all_stopped():
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            return all(open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] in "tT" for t in tasks)
        except OSError:
            return True  # gone: nothing runs
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        wait_until(all_stopped, timeout=10, step=0.002)
        if pred():
            return True
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    return False


def holds_for(pred, seconds, step=0.02):
    """Whether `pred` holds throughout `seconds` (checked every `step`): for "and nothing else
    happens". Load only lengthens the look, so it can miss a late event but never fail a correct run;
    say in the test why `seconds` is long enough."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not pred():
            return False
        time.sleep(step)
    return bool(pred())


def reused_without_compiling(metrics):
    """A gate follower that compiled nothing: it traced its own code (every process does: docs/cachelock.md, "What
    is exact") and found every graph in the FX-graph cache, no miss."""
    m = metrics
    return m.get("fxgraph_cache_hit", 0) > 0 and m.get("fxgraph_cache_miss", 0) == 0

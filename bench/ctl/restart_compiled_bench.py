#!/usr/bin/env python3
"""`ctl restart drafter` of 3 gated torch.compile drafters while 5 targets run (issue 22, item 4), in one run
of this script, against a cold start of the same drafters and an eager start of the same script:

  eager     the drafters with --no-compile (ungated: nothing to compile): launch, then restarts
  compiled  torch.compile, gate (serial), the default config: cold launch on an empty cache, then restarts
            (every restarted drafter follows: it traces, FX-graph and AOTAutograd hits)

Targets: tests/payloads/ctl_step.py (a step every 0.5 s). Drafters: bench/ctl/compiled_drafter.py (the reference
drafter's model at the test shapes, one training step, READY, then idle). Wall: `dflash-launch run` spawn (cold)
or the `ctl restart drafter` request (restart) -> all 3 drafters RUNNING with new pids (RUNNING = READY=1, sent
after the first step). CPU: user + sys of each drafter's process tree to its first step (the payload's rusage of
itself and its reaped children, imports included) plus its dflash-worker's, summed over the 3.

Usage: python3 bench/ctl/restart_compiled_bench.py [--bin build/bin] [--restarts 2] [--out docs/benchmarks.md]
"""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "ctl"))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks_md import write_section  # noqa: E402
from run_bench import Ours  # noqa: E402  (bench/ctl/run_bench.py: the run, its socket and ctl)
from supervise import SMALL_MODEL  # noqa: E402

TARGET = ROOT / "tests" / "payloads" / "ctl_step.py"
DRAFTER = ROOT / "bench" / "ctl" / "compiled_drafter.py"
HEADING = "## live control: `ctl restart` of compiled drafters"
TICK = os.sysconf("SC_CLK_TCK")


def write_config(d, compiled):
    """5 targets + 3 drafters (the drafters compiled or not, gated when compiled)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "cache").mkdir(mode=0o700, exist_ok=True)
    (d / "out").mkdir()
    drafter = [sys.executable, str(DRAFTER)] + ([] if compiled else ["--no-compile"])
    gate = 'gate = { timeout = "30m", mode = "serial" }\n' if compiled else ""
    env = (f'{{ BENCH_OUT = "{d / "out"}", TORCHINDUCTOR_COMPILE_THREADS = "1", '
           f'PYTHONPATH = "{ROOT / "python"}" }}')
    p = d / "run.toml"
    p.write_text(
        f'[run]\nname = "b"\ncache_dir = "cache"\nlog_dir = "runs"\n{SMALL_MODEL}\n'
        f'[[role]]\nname = "target"\ncpu = 5\ncommand = {json.dumps([sys.executable, str(TARGET)])}\n'
        'ready = "notify"\nenv = { STEP_S = "0.5" }\nstop = { grace = "5s" }\n\n'
        f'[[role]]\nname = "drafter"\ncpu = 3\ncommand = {json.dumps(drafter)}\nenv = {env}\n{gate}'
        'ready = { mode = "notify", timeout = "30m" }\nstop = { grace = "5s" }\n')
    return p


class Run(Ours):
    """bench/ctl/run_bench.py's run (socket, ctl, wait, stop) of our own run.toml, with room for a cold compile."""

    def __init__(self, args, d, config):
        self.bin = args.bin / "dflash-launch"
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(d / "xdg"))
        (d / "xdg").mkdir(mode=0o700)
        self.proc = subprocess.Popen([str(self.bin), "run", str(config), "--run-id", "b", "--plain"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=self.env, start_new_session=True)
        self.run_dir = d / "runs" / "b"
        try:
            self.wait(lambda s: len(s) == 8 and all(p["state"] == "RUNNING" for p in s.values()), 900)
        except BaseException:
            if self.proc.poll() is None:  # never leave the run behind
                self.stop()
            raise

    def wait(self, pred, timeout=60):
        """Polls every 20 ms (not 2: the poll would take CPU from the compiles it times); stops if the run ends."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the run ended (exit {self.proc.returncode}); logs in {self.run_dir}")
            if (self.run_dir / "control.sock").exists() and pred(self.status()):
                return
            time.sleep(0.02)
        raise SystemExit("timed out waiting for the run")


def worker_cpu_s(proc):
    """The started process's own CPU when it is a dflash-worker in front of the payload (else the payload's
    facts already hold it)."""
    if proc["pid"] == proc.get("payload_pid") or proc.get("payload_pid", -1) <= 0:
        return 0.0
    try:
        f = open(f"/proc/{proc['pid']}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def drafters(status):
    return {n: p for n, p in status.items() if n.startswith("drafter")}


def round_facts(d, status, seen):
    """CPU and cache counters of the drafters now RUNNING (their facts files not in `seen`)."""
    procs = drafters(status)
    cpu, counters = 0.0, []
    for name, p in sorted(procs.items()):
        pid = p["payload_pid"] if p.get("payload_pid", -1) > 0 else p["pid"]  # ungated: no worker in between
        f = d / "out" / f"{name.replace(':', '_')}.{pid}.json"
        facts = json.loads(f.read_text())
        assert f not in seen, f"{name}: no new first step"
        seen.add(f)
        cpu += facts["cpu_s"] + worker_cpu_s(p)
        counters.append(facts)
    return cpu, counters


def run_variant(args, tmp, label, compiled):
    d = tmp / label
    t = time.perf_counter()
    o = Run(args, d, write_config(d, compiled))  # all 8 RUNNING: the drafters after their first step
    cold_wall = time.perf_counter() - t
    try:
        return measure(args, o, d, cold_wall)
    finally:
        o.stop()


def measure(args, o, d, cold_wall):
    seen = set()
    cold_cpu, cold_counters = round_facts(d, o.status(), seen)
    targets = {n: p["pid"] for n, p in o.status().items() if n.startswith("target")}
    walls, cpus, counters = [], [], []
    for _ in range(args.restarts):
        old = {n: p["pid"] for n, p in drafters(o.status()).items()}
        t = time.perf_counter()
        r = o.ctl("restart", "drafter")
        assert r.returncode == 0, r.stderr
        o.wait(lambda s: all(s.get(n, {}).get("state") == "RUNNING" and s[n]["pid"] not in (-1, old[n])
                             for n in old), timeout=600)
        walls.append(time.perf_counter() - t)
        cpu, c = round_facts(d, o.status(), seen)
        cpus.append(cpu)
        counters.append(c)
    assert {n: p["pid"] for n, p in o.status().items() if n.startswith("target")} == targets, "a target restarted"
    return {"cold_wall": cold_wall, "cold_cpu": cold_cpu, "cold_counters": cold_counters,
            "walls": walls, "cpus": cpus, "counters": counters}


def hits(counters):
    """Per drafter: fxgraph hit/miss."""
    if not counters or "fxgraph_cache_hit" not in counters[0]:
        return "-"
    return ", ".join(f"{c['fxgraph_cache_hit']}/{c['fxgraph_cache_miss']}" for c in counters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, default=ROOT / "build" / "bin")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    args.bin = args.bin.resolve()
    os.environ["PATH"] = f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="restart_bench_"))
    res = {}
    try:
        for label, compiled in (("eager", False), ("compiled", True)):
            print(f"{label} ...", file=sys.stderr, flush=True)
            res[label] = run_variant(args, tmp, label, compiled)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    e_wall, e_cpu = med(res["eager"]["walls"]), med(res["eager"]["cpus"])
    names = {"eager": "eager (`--no-compile`, ungated)", "compiled": "compiled, gate (the default config)"}
    rows = []
    for label in ("eager", "compiled"):
        r = res[label]
        rows.append(f"| {names[label]} | cold launch (empty cache) | {r['cold_wall']:.1f} | "
                    f"{r['cold_wall'] / e_wall:.2f}x | {r['cold_cpu']:.1f} | {r['cold_cpu'] / e_cpu:.2f}x | "
                    f"{hits(r['cold_counters'])} |")
        w, c = med(r["walls"]), med(r["cpus"])
        rows.append(f"| {names[label]} | `ctl restart drafter` (median of {len(r['walls'])}) | {w:.1f} | "
                    f"{w / e_wall:.2f}x | {c:.1f} | {c / e_cpu:.2f}x | {hits(r['counters'][-1])} |")
    raw = "; ".join(f"{label}: restart walls {', '.join(f'{x:.1f}' for x in res[label]['walls'])} s, "
                    f"CPU {', '.join(f'{x:.1f}' for x in res[label]['cpus'])} s" for label in res)
    c_w, c_c = med(res["compiled"]["walls"]) / e_wall, med(res["compiled"]["cpus"]) / e_cpu
    load = os.getloadavg()
    cmd = "python3 bench/ctl/restart_compiled_bench.py " + " ".join(sys.argv[1:])
    md = f"""{HEADING}

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine shared with other work (load average
{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end), torch {__import__('torch').__version__} (CPU). A run of 5 targets
(`tests/payloads/ctl_step.py`, a step every 0.5 s) + 3 drafters (`bench/ctl/compiled_drafter.py`: the reference
drafter's model at the test shapes, tests/supervise.py SMALL_MODEL, one training step, READY, then idle), gate
mode `serial`, `TORCHINDUCTOR_COMPILE_THREADS=1`. Wall: launch (cold) or the `ctl restart drafter` request ->
all 3 drafters RUNNING with new pids (RUNNING = READY=1, sent after the first step), targets untouched. CPU:
user + sys of the 3 drafters' process trees to their first step (payload with its reaped children, imports
included, plus its dflash-worker). Ratios are to the eager restart of the same run. Goal (issue 22): restarted
drafters reach their first step in <= 1.3x the time of an eager start.

| drafters | start | wall s | / eager restart | CPU s (3 trees) | / eager restart | fxgraph hit/miss per drafter |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- Restart vs eager: {c_w:.2f}x wall, {c_c:.2f}x CPU (goal 1.3x: {"met" if c_w <= 1.3 else "not met"}).
- Each round: {raw}.
"""
    print(md)
    if args.out:
        write_section(args.out, HEADING, md)


if __name__ == "__main__":
    main()

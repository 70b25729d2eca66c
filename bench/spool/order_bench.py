#!/usr/bin/env python3
"""What WorldSource's fixed order (docs/checkpoints.md, "Deterministic delivery") costs when one producer is slow:
2 producers publish into one spool at once, "fast" with no pause and "slow" with --slow-ms before each frame; 3 gloo
ranks take a "step" of --step-ms per frame (a sleep: the order is what is measured, not torch) and acknowledge it.
Three consumers, interleaved, --repeat times, the same spool shape and producers each time:

- SpoolSource per rank (the unordered peer: each rank claims whatever is ready, no agreement)
- WorldSource(order="arrival") (the agreement, frames as they arrive)
- WorldSource(order="fixed") (the default: producers by name, sequence numbers in turns, a replayable order)

Measured: the time until the world has consumed its first --first frames (the slow producer still publishing: what a
run feels while one producer lags) and until it has consumed every frame; medians into docs/benchmarks.md
("spool: the fixed order with a slow producer").

Usage: .venv/bin/python bench/spool/order_bench.py [--repeat 3] [--out docs/benchmarks.md]"""
import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "spool"))
from world_bench import CONTRACT_ENV, free_port  # noqa: E402  (the same contract and port picking)

# Every process says it is set up (torch imported, its world met), then waits for the common start the bench
# writes: on a loaded machine the imports take seconds, and they are no part of what is measured.
START = r"""
import os, time
def wait_for_start(ctl, name):
    open(os.path.join(ctl, "ready-" + name), "w").close()
    while not os.path.exists(os.path.join(ctl, "start")):
        time.sleep(0.005)
    t0 = float(open(os.path.join(ctl, "start")).read())
    time.sleep(max(0.0, t0 - time.time()))
    return t0
"""
PRODUCER = START + r"""
import sys, torch
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolProducer
root, name, frames, pause, ctl = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) / 1000, sys.argv[5]
p = SpoolProducer(root, name, contract_from_env(), max_ready=frames + 1, producers=2)
hidden, tokens = torch.randn(1, 64, 320), torch.randint(0, 255, (1, 64))
wait_for_start(ctl, name)
for _ in range(frames):
    time.sleep(pause)
    p.publish(hidden, tokens)
p.finish()
"""
RANK = START + r"""
import json, sys, torch.distributed as dist
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
from dflash_launch.spool import WorldSource
from dflash_launch.train_metrics import TrainingMetrics
root, rank, port, kind, step, ctl = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]) / 1000, sys.argv[6]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
src = SpoolSource(root, f"d:{rank}", contract_from_env(), producers=2)
if kind != "plain":
    src = WorldSource(src, metrics=TrainingMetrics(path=""), order=kind)
dist.barrier()
t0 = wait_for_start(ctl, f"d{rank}")
done = []
for s in src:
    time.sleep(step)
    s["ack"]()
    if not s.get("padded"):
        done.append(time.time() - t0)
print(json.dumps(done))
dist.barrier()
"""


def one(kind, a):
    env = dict(os.environ, **CONTRACT_ENV, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d, tempfile.TemporaryDirectory() as ctl:
        port = str(free_port())
        prods = [subprocess.Popen([sys.executable, "-c", PRODUCER, d, name, str(n), str(ms), ctl], env=env)
                 for name, n, ms in (("fast:0", a.fast_frames, 0), ("slow:0", a.slow_frames, a.slow_ms))]
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, d, str(r), port, kind, str(a.step_ms), ctl],
                                  env=env, stdout=subprocess.PIPE, text=True) for r in range(3)]
        deadline = time.time() + 300
        while len([f for f in os.listdir(ctl) if f.startswith("ready-")]) < 5:
            assert time.time() < deadline and all(p.poll() is None for p in prods + ranks), "a process never got ready"
            time.sleep(0.02)
        with open(os.path.join(ctl, "start.tmp"), "w") as f:
            f.write(repr(time.time() + 0.2))
        os.rename(os.path.join(ctl, "start.tmp"), os.path.join(ctl, "start"))
        times = sorted(t for p in ranks for t in json.loads(p.communicate(timeout=600)[0]))
        for p in prods:
            assert p.wait(timeout=60) == 0
    total = a.fast_frames + a.slow_frames
    assert len(times) == total, (kind, len(times), total)
    return times[a.first - 1], times[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast-frames", type=int, default=150)
    ap.add_argument("--slow-frames", type=int, default=45)
    ap.add_argument("--slow-ms", type=float, default=60.0)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--first", type=int, default=90)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    kinds = ("plain", "arrival", "fixed")
    first = {k: [] for k in kinds}
    last = {k: [] for k in kinds}
    for _ in range(a.repeat):
        for k in kinds:
            f, l = one(k, a)
            first[k].append(f)
            last[k].append(l)
    mf = {k: statistics.median(v) for k, v in first.items()}
    ml = {k: statistics.median(v) for k, v in last.items()}
    load = os.getloadavg()[0]
    slow_s = a.slow_frames * a.slow_ms / 1000
    cmd = (f"bench/spool/order_bench.py --fast-frames {a.fast_frames} --slow-frames {a.slow_frames} "
           f"--slow-ms {a.slow_ms:g} --step-ms {a.step_ms:g} --first {a.first} --repeat {a.repeat}")
    md = f"""## spool: the fixed order with a slow producer (issue #45)

`{cmd}` ({datetime.date.today()}, 2 vCPUs, shared, load average {load:.1f} at the end): producers "fast" ({a.fast_frames}
frames, no pause) and "slow" ({a.slow_frames} frames, {a.slow_ms:g} ms before each: {slow_s:.1f} s in all) publish into
one spool in /dev/shm while 3 gloo ranks take a {a.step_ms:g} ms step (a sleep) per frame; seconds from the common
start, median of {a.repeat}, interleaved.

| consumer | first {a.first} frames | vs unordered | every frame | vs unordered |
|---|---:|---:|---:|---:|
| SpoolSource per rank (the unordered peer) | {mf['plain']:.2f} s | 1.00x | {ml['plain']:.2f} s | 1.00x |
| WorldSource, order="arrival" | {mf['arrival']:.2f} s | {mf['arrival'] / mf['plain']:.2f}x | {ml['arrival']:.2f} s | {ml['arrival'] / ml['plain']:.2f}x |
| WorldSource, order="fixed" (the default) | {mf['fixed']:.2f} s | {mf['fixed'] / mf['plain']:.2f}x | {ml['fixed']:.2f} s | {ml['fixed'] / ml['plain']:.2f}x |

Fixed vs arrival, same run: first {a.first} frames {mf['fixed'] / mf['arrival']:.2f}x, every frame
{ml['fixed'] / ml['arrival']:.2f}x. Why: while the slow producer lags, the fixed order takes one frame of each producer
per cycle, so the world can consume at most twice the slow producer's rate (here {2000 / a.slow_ms:.0f} frames/s),
whatever the fast one offers; every order waits for the slow producer's last frame, and once it has finished the
fixed order deals the fast producer's remaining frames alone. The knob is
`WorldSource(..., order="arrival")` (docs/checkpoints.md): exactly-once still holds with a checkpoint, the bitwise
replay does not.
"""
    print(md)
    if a.out:
        from benchmarks_md import write_section
        write_section(pathlib.Path(a.out), "## spool: the fixed order with a slow producer (issue #45)", md)


if __name__ == "__main__":
    main()

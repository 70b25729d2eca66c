#!/usr/bin/env python3
"""What the compile gate saves: 3 reference drafters (real torch.compile, CPU)
until all are ready, in one run, for

  one   a single drafter compiling alone on a cold cache (the unit: "one compile")
  (a)   gate on, one shared cache            (dflash-launch, gate = {...})
  (b)   one shared cache, no gate            (the three compile at once)
  (c)   one cache dir per process            (the usual workaround, pytorch#153791)

CPU is each drafter's own rusage, self + children, from its start to its first
compiled step (TORCHINDUCTOR_COMPILE_THREADS=1 keeps the compile in-process and
its g++ children reaped). Every variant runs twice: torch's defaults, and with
TORCHINDUCTOR_VEC_ISA_OK=1, which skips Inductor's per-process CPU ISA probe
(~10 subprocesses) that even a fully warm process pays.

Usage: python3 bench/compile/run_bench.py [--bin build/bin] [--out docs/benchmarks.md]
"""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from benchmarks_md import write_section  # noqa: E402
from supervise import SMALL_MODEL  # noqa: E402

MODEL = SMALL_MODEL


def config(d, n, gate, per_process_cache, isa_ok):
    (d / "cache").mkdir(mode=0o700, exist_ok=True)
    drafter = '"python", "-m", "dflash_launch.roles.reference_drafter"'
    if per_process_cache:  # each rank its own Inductor cache dir
        drafter = ('"sh", "-c", "export TORCHINDUCTOR_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR/rank$RANK; '
                   'exec python -m dflash_launch.roles.reference_drafter"')
    env = 'DFLASH_STEPS = "1", TORCHINDUCTOR_COMPILE_THREADS = "1"' + (
        ', TORCHINDUCTOR_VEC_ISA_OK = "1"' if isa_ok else "")
    path = d / "run.toml"
    path.write_text(f'[run]\nname = "c"\ncache_dir = "cache"\nlog_dir = "runs"\n{MODEL}\n'
                    f'[[role]]\nname = "drafter"\ncpu = {n}\ncommand = [{drafter}]\nenv = {{ {env} }}\n'
                    + ('gate = { timeout = "30m", mode = "serial" }\n' if gate else "")
                    + 'ready = { mode = "notify", timeout = "30m" }\n')
    return path


def run_variant(args, n, gate=False, per_process_cache=False, isa_ok=False):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-compile-"))
    cfg = config(d, n, gate, per_process_cache, isa_ok)
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run([str(args.bin / "dflash-launch"), "run", str(cfg), "--run-id", "b", "--color", "never"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    if r.returncode != 0:
        sys.exit(f"variant failed (exit {r.returncode}); logs in {d}")
    s = json.loads((d / "runs/b/summary.json").read_text())
    procs = []
    for p in s["processes"]:
        m = p["metrics"]
        procs.append({"name": p["name"], "role": (p["gate"] or {}).get("role", "-"), "cpu": m["compile_cpu_s"],
                      "wall": m["compile_wall_s"], "ready": p["ready_s"], "wait": (p["gate"] or {}).get("wait_s", 0),
                      "hit": m["fxgraph_cache_hit"], "miss": m["fxgraph_cache_miss"],
                      "ahit": m["autograd_cache_hit"], "amiss": m["autograd_cache_miss"],
                      "breakdown": m.get("compile_breakdown", {})})
    shutil.rmtree(d)
    return procs


def summarize(procs):
    return sum(p["cpu"] for p in procs), max(p["ready"] for p in procs)


def main():
    ap = argparse.ArgumentParser()
    root = pathlib.Path(__file__).resolve().parents[2]
    ap.add_argument("--bin", type=pathlib.Path, default=root / "build/bin")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()

    rows, detail = [], []
    for isa_ok in (False, True):
        tag = "TORCHINDUCTOR_VEC_ISA_OK=1" if isa_ok else "torch defaults"
        print(f"[{tag}] one compile ...", file=sys.stderr)
        one = run_variant(args, 1, isa_ok=isa_ok)
        unit_cpu = one[0]["cpu"]
        res = {}
        for key, kw in (("a", dict(gate=True)), ("b", {}), ("c", dict(per_process_cache=True))):
            print(f"[{tag}] ({key}) ...", file=sys.stderr)
            res[key] = run_variant(args, 3, isa_ok=isa_ok, **kw)
        a_cpu, a_wall = summarize(res["a"])
        leader = [p for p in res["a"] if p["role"] == "lead"][0]
        followers = [p for p in res["a"] if p["role"] == "reuse"]
        for key, label in (("a", "(a) gate on, shared cache"), ("b", "(b) shared cache, no gate"),
                           ("c", "(c) a cache dir per process")):
            cpu, wall = summarize(res[key])
            hm = ", ".join(f"{p['name']} {p['hit']}/{p['miss']}" for p in res[key])
            rows.append(f"| {tag} | {label} | {cpu:.1f} | {cpu / unit_cpu:.2f}x | {wall:.1f} | {hm} |")
        rows.append(f"| {tag} | one compile alone | {unit_cpu:.1f} | 1.00x | {one[0]['ready']:.1f} | "
                    f"{one[0]['name']} {one[0]['hit']}/{one[0]['miss']} |")
        c_cpu, c_wall = summarize(res["c"])
        b_cpu, b_wall = summarize(res["b"])
        detail.append(
            f"- **{tag}**: (a) = {a_cpu / unit_cpu:.2f}x one compile; followers "
            + ", ".join(f"{p['name']} {p['cpu']:.1f} s = {p['cpu'] / leader['cpu'] * 100:.0f}% of the leader's "
                        f"{leader['cpu']:.1f} s (waited {p['wait']:.1f} s)" for p in followers)
            + f". (c)/(a): CPU {c_cpu / a_cpu:.2f}x, wall {c_wall / a_wall:.2f}x; (b)/(a): CPU {b_cpu / a_cpu:.2f}x, "
              f"wall {b_wall / a_wall:.2f}x.")
        f = followers[0]["breakdown"]
        detail.append("  A follower's compile phases (s): " + ", ".join(f"{k} {v}" for k, v in sorted(f.items())))

    cmd = "python3 bench/compile/run_bench.py " + " ".join(sys.argv[1:])
    md = f"""## compile gate

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine, torch {__import__('torch').__version__} (CPU,
Inductor C++ kernels built with g++), 3 reference drafters (`python/dflash_launch/roles/reference_drafter.py`, demo
shapes: input [1, 64, 320], 2 draft layers), each until its first compiled training step (forward + backward).
CPU = each drafter's rusage (self + children) to its first step; "all ready" = the last drafter's spawn-to-ready.
Must: (a) <= 1.8x one compile, each follower <= 40% of the leader. Goal: (a) <= 1.3x.

| setting | variant | CPU s (sum of 3) | / one compile | wall s until all ready | fxgraph hit/miss per process |
|---|---|---|---|---|---|
{chr(10).join(rows)}

{chr(10).join(detail)}
"""
    print(md)
    if args.out:
        write_section(args.out, "## compile gate", md)


if __name__ == "__main__":
    main()

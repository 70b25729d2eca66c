#!/usr/bin/env python3
"""What a follower still pays with and without Dynamo's precompile artifact (gate.precompile, issue 22):
3 reference drafters behind the gate, each until its first compiled training step, in one run of this script, for

  eager       one drafter with --no-compile (the floor: imports, model, one eager step)
  one         one drafter compiling alone on a cold cache (the leader's cost: "one compile")
  off         gate on, gate.precompile = false (followers hit the FX-graph cache)
  on          gate on, gate.precompile = true  (followers load the leader's Dynamo artifact; the default where the
              payload hook loads)
each of off and on in gate mode serial (the first drafter leads, two reuse) and warmup (a warm-up process
compiles, then the three start and reuse).

CPU is each drafter's own rusage (self + children) from its start to its first step
(reference_drafter's compile_cpu_s). The issue's goals: a follower's whole process to READY <= 8 % of the
leader's compile above an eager run ((F - E) / (L - E)).

Usage: python3 bench/compile/precompile_bench.py [--bin build/bin] [--out docs/benchmarks.md]
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


def run_variant(args, n, gate=None, eager=False, mode="serial"):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-precompile-"))
    (d / "cache").mkdir(mode=0o700)
    cmd = '"python", "-m", "dflash_launch.reference_drafter"' + (', "--no-compile"' if eager else "")
    gate_line = ""
    if gate is not None:
        gate_line = f'gate = {{ timeout = "30m", mode = "{mode}", precompile = {"true" if gate else "false"} }}\n'
    (d / "run.toml").write_text(
        f'[run]\nname = "p"\ncache_dir = "cache"\nlog_dir = "runs"\n{SMALL_MODEL}\n'
        f'[[role]]\nname = "drafter"\ncpu = {n}\ncommand = [{cmd}]\n'
        'env = { DFLASH_STEPS = "1", TORCHINDUCTOR_COMPILE_THREADS = "1" }\n' + gate_line +
        'ready = { mode = "notify", timeout = "30m" }\n')
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    r = subprocess.run([str(args.bin / "dflash-launch"), "run", str(d / "run.toml"), "--run-id", "b", "--color",
                        "never"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    if r.returncode != 0:
        sys.exit(f"variant failed (exit {r.returncode}); logs in {d}")
    s = json.loads((d / "runs/b/summary.json").read_text())
    procs = []
    for p in s.get("warmups", []) + s["processes"]:
        m, g = p["metrics"], p["gate"] or {}
        procs.append({"name": p["name"], "role": g.get("role", "-"), "cpu": m["compile_cpu_s"], "ready": p["ready_s"],
                      "hit": m["fxgraph_cache_hit"], "miss": m["fxgraph_cache_miss"],
                      "dyn": m.get("dynamo_cache_hit", 0), "precompiled": g.get("precompiled"),
                      "why": g.get("precompile", "")})
    shutil.rmtree(d)
    return procs


def main():
    ap = argparse.ArgumentParser()
    root = pathlib.Path(__file__).resolve().parents[2]
    ap.add_argument("--bin", type=pathlib.Path, default=root / "build/bin")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()

    print("eager ...", file=sys.stderr)
    eager = run_variant(args, 1, eager=True)[0]["cpu"]
    print("one compile ...", file=sys.stderr)
    one = run_variant(args, 1)[0]["cpu"]
    rows, detail = [], []
    variants = [(mode, on) for mode in ("serial", "warmup") for on in (False, True)]
    for mode, on in variants:
        label = f"{mode}, precompile {'on (the default)' if on else 'off'}"
        print(f"{label} ...", file=sys.stderr)
        procs = run_variant(args, 3, gate=on, mode=mode)
        leader = [p for p in procs if p["role"] != "reuse"][0]  # the serial leader, or the warm-up
        followers = [p for p in procs if p["role"] == "reuse"]
        for p in procs:
            rows.append(f"| {label} | {p['name']} | {p['role']} | {p['cpu']:.2f} | "
                        f"{(p['cpu'] - eager) / (one - eager) * 100:.1f}% | {p['hit']}/{p['miss']} | {p['dyn']} | "
                        f"{p['why'] or '-'} |")
        mean = sum(f["cpu"] for f in followers) / len(followers)
        detail.append(f"- **{label}**: followers {mean:.2f} s CPU on average = "
                      f"{(mean - eager) / (one - eager) * 100:.1f}% of one compile above eager "
                      f"({leader['name']}, {leader['cpu']:.2f} s); all {len(procs)} "
                      f"{sum(p['cpu'] for p in procs) / one:.2f}x one compile.")
    cmd = "python3 bench/compile/precompile_bench.py " + " ".join(sys.argv[1:])
    md = f"""## compile gate: followers with Dynamo's precompile artifact

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine, torch {__import__('torch').__version__} (CPU),
the reference drafter at the test shapes (tests/supervise.py SMALL_MODEL), 3 drafters in gate mode serial (the
first leads) and warmup (a warm-up compiles, then the three start), each process to its first compiled step.
Eager (`--no-compile`, the floor): **{eager:.2f} s** CPU; one compile alone: **{one:.2f} s**.
"above eager" = (process CPU - eager) / (one compile - eager). Goal (issue 22): a follower <= 8 %.

| variant | process | gate | CPU s | above eager, of one compile | fxgraph hit/miss | dynamo hits | precompile |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{chr(10).join(detail)}
"""
    print(md)
    if args.out:
        write_section(args.out, "## compile gate: followers with Dynamo's precompile artifact", md)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Issue #10's benchmark: 3 DDP ranks (gloo, one world; tests/payloads/ddp_step.py,
an unmodified DDP script with a compiled step), from launch until every rank is
past its first compiled step, in one run, for

  one   a single process (world of one) on a cold cache: "one compile"
  (a)   gate on (mode warmup, what `gate = true` gives 3 processes), world = "role": every
        rank starts after the warm-up (hold all, the default)
  (a')  the same with gate hold = "one": ranks 1 and 2 start with the warm-up and wait for
        rank 0 in init_process_group
  (b)   shared cache, no gate: the three compile at once
  (c)   a cache dir per rank (the usual workaround, pytorch#153791)
  warm  the 3 ranks again on (a)'s cache: what a run costs without any compile

CPU = the whole run's CPU (every process, reaped: RUSAGE_CHILDREN of dflash-launch);
compile CPU = CPU - the same shape's CPU on a warm cache. Wall = launch to "all 3
processes are running" (every rank sent READY after its first compiled step).
Goal: (a)'s compile CPU <= 1.3x one compile; (a)'s wall <= 1.3x one cold compile's.

Usage: python3 bench/ddp/run_bench.py [--bin build/bin] [--out docs/benchmarks.md] [--repeat 2]
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchmarks_md import write_section  # noqa: E402

PY = sys.executable
PORT = [23000]


def config(args, d, n, gate, per_rank=False, hold="all"):
    (d / "cache").mkdir(mode=0o700, exist_ok=True)
    PORT[0] += 10
    env = 'TORCHINDUCTOR_COMPILE_THREADS = "1", DDP_STEPS = "1"' + (', PER_RANK_CACHE = "1"' if per_rank else "")
    if args.model == "drafter":
        env += f', DDP_MODEL = "drafter", DDP_LAYERS = "{args.layers}"'
    path = d / "run.toml"
    path.write_text(f'[run]\nname = "ddp"\ncache_dir = "cache"\nlog_dir = "runs"\nmaster_port = {PORT[0]}\n'
                    f'[[role]]\nname = "drafter"\ncpu = {n}\n'
                    f'command = ["{PY}", "{ROOT / "tests/payloads/ddp_step.py"}"]\nenv = {{ {env} }}\n'
                    + ((f'gate = {{ hold = "{hold}" }}\n'
                        'world = "role"\n') if gate else "")
                    + 'ready = { mode = "notify", timeout = "30m" }\n')
    return path


def stamp(line):
    hms = line.split()[1]
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def launch(args, d, cfg, run_id):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([str(args.bin / "dflash-launch"), "run", str(cfg), "--run-id", run_id, "--color", "never"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"variant failed (exit {r.returncode}); logs in {d}/runs/{run_id}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = (d / "runs" / run_id / "supervisor.log").read_text().splitlines()
    ready = [l for l in log if re.search(r"all \d+ processes are running", l)][0]
    s = json.loads((d / "runs" / run_id / "summary.json").read_text())
    hm = ", ".join(f"{p['metrics']['fxgraph_cache_hit']}/{p['metrics']['fxgraph_cache_miss']}"
                   + (" dyn 1" if p["metrics"].get("dynamo_cache_hit") else "") for p in s["processes"])
    # A warm-up that found READY ran no payload: no metrics.
    step_cpu = sum(p["metrics"]["first_step_cpu_s"] for p in s["processes"] + s.get("warmups", []) if p["metrics"])
    return {"cpu": cpu, "wall": stamp(ready) - stamp(log[0]), "hm": hm, "step_cpu": step_cpu}


def variant(args, n, gate=False, per_rank=False, warm_again=False, hold="all"):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    cfg = config(args, d, n, gate, per_rank, hold)
    cold = launch(args, d, cfg, "cold")
    warm = launch(args, d, cfg, "warm") if warm_again else None
    shutil.rmtree(d)
    return cold, warm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, default=ROOT / "build/bin")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--model", choices=("toy", "drafter"), default="toy")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    runs = []
    for i in range(args.repeat):
        print(f"round {i + 1}: one ...", file=sys.stderr)
        one, one_warm = variant(args, 1, warm_again=True)
        print(f"round {i + 1}: (a) ...", file=sys.stderr)
        a, warm = variant(args, 3, gate=True, warm_again=True)
        print(f"round {i + 1}: (a') ...", file=sys.stderr)
        a_one, _ = variant(args, 3, gate=True, hold="one")
        print(f"round {i + 1}: (b) ...", file=sys.stderr)
        b, _ = variant(args, 3)
        print(f"round {i + 1}: (c) ...", file=sys.stderr)
        c, _ = variant(args, 3, per_rank=True)
        runs.append(dict(one=one, one_warm=one_warm, a=a, a_one=a_one, b=b, c=c, warm=warm))
    rows, ratios = [], []
    for i, r in enumerate(runs):
        unit = r["one"]["cpu"] - r["one_warm"]["cpu"]
        base = r["warm"]["cpu"]
        step_unit = r["one"]["step_cpu"] - r["one_warm"]["step_cpu"]
        step_base = r["warm"]["step_cpu"]
        for key, label in (("one", "one process alone, cold"), ("a", "(a) gate on (warmup), shared cache"),
                           ("a_one", "(a') gate on (warmup, hold one), shared cache"),
                           ("b", "(b) shared cache, no gate"), ("c", "(c) a cache dir per rank"),
                           ("warm", "3 ranks on a warm cache")):
            v = r[key]
            compile_cpu = v["cpu"] - (r["one_warm"]["cpu"] if key == "one" else base)
            step_cpu = v["step_cpu"] - (r["one_warm"]["step_cpu"] if key == "one" else step_base)
            rows.append(f"| {i + 1} | {label} | {v['cpu']:.1f} | {compile_cpu:.1f} | {compile_cpu / unit:.2f}x | "
                        f"{step_cpu:.1f} | {step_cpu / step_unit:.2f}x | "
                        f"{v['wall']:.1f} | {v['wall'] / r['one']['wall']:.2f}x | {v['hm']} |")
        ratios.append(f"- round {i + 1}: (a) compile CPU {(r['a']['cpu'] - base) / unit:.2f}x one compile "
                      f"(in-step {(r['a']['step_cpu'] - step_base) / step_unit:.2f}x), wall "
                      f"{r['a']['wall'] / r['one']['wall']:.2f}x one cold compile (hold one: "
                      f"{r['a_one']['wall'] / r['one']['wall']:.2f}x); (b)/(a) CPU "
                      f"{r['b']['cpu'] / r['a']['cpu']:.2f}x, wall {r['b']['wall'] / r['a']['wall']:.2f}x; (c)/(a) CPU "
                      f"{r['c']['cpu'] / r['a']['cpu']:.2f}x, wall {r['c']['wall'] / r['a']['wall']:.2f}x")
    cmd = "python3 bench/ddp/run_bench.py " + " ".join(sys.argv[1:])
    title = "## compile gate, DDP ranks (gate mode warmup)" + (
        f", drafter-shaped model ({args.layers} blocks)" if args.model == "drafter" else ", toy model")
    what = (f"a DFlash-drafter-shaped model, fc 320 -> 64 and {args.layers} decoder blocks" if args.model == "drafter"
            else "a 2-layer MLP")
    md = f"""{title}

`{cmd.strip()}` -- {datetime.date.today()}, this 2-core machine, torch {__import__('torch').__version__} (CPU, gloo),
3 ranks of one DDP world (`tests/payloads/ddp_step.py`, {what}: an unmodified DDP script, compiled step, notify
after the first compiled step), `TORCHINDUCTOR_COMPILE_THREADS=1`. CPU = every process of the run (reaped rusage of
dflash-launch); compile CPU = CPU minus the same shape on a warm cache (one process: its warm rerun; 3 ranks: the
"warm" row): the warm-up's whole process start counts as compile cost. In-step = the CPU of every process's first
compiled step (warm-up included; the payload measures it) minus the same on the warm cache: the compile alone.
Wall = launch to all ranks past their first compiled step. (a): `gate = true` (every rank starts after the
warm-up; each rank traces and hits the warm-up's FX-graph and AOTAutograd entries); (a'): `hold = "one"` (ranks 1 and 2 start with the warm-up and wait in init_process_group for rank 0).
Goal: (a) compile CPU <= 1.3x one compile, wall <= 1.3x one cold compile.

| round | variant | CPU s | compile CPU s | / one compile | in-step compile CPU s | / one | wall s | / one cold compile | fxgraph hit/miss per rank (dyn: Dynamo artifact loaded) |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

{chr(10).join(ratios)}
"""
    print(md)
    if args.out:
        write_section(args.out, title, md)


if __name__ == "__main__":
    main()

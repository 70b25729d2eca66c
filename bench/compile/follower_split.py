#!/usr/bin/env python3
"""Where a follower's CPU goes (issues 22 and 44), phase by phase, in one run of this script:

  a leader (fresh cache dir) compiles the reference drafter's step at the test shapes; then followers on that
  cache, each a fresh process that traces its own code (docs/cachelock.md, "What is exact"), timed per phase (user
  + sys of the process and its reaped children, and wall): interpreter start, `import torch`, Dynamo/Inductor
  imports, Inductor's CPU ISA probe (valid_vec_isa_list(), called before the compile so that its cost stands
  alone), the model, the torch.compile() call, and the first step (Dynamo's trace, the FX-graph and AOTAutograd
  cache hits, loading the kernels, fwd + bwd).
  Followers: `probe` (torch's default), `isa-ok` (TORCHINDUCTOR_VEC_ISA_OK=1: trust /proc/cpuinfo) and `shared`
  (the leader's probe verdicts from the cache dir, python/dflash_launch/inductor/isa_verdict.py; the others run with
  DFLASH_ISA_SHARE=0). Every process is gated (DFLASH_GATE_ROLE) and imports dflash_launch, as a payload would.

Usage: python3 bench/compile/follower_split.py [--followers 3] [--out docs/benchmarks.md]
"""
import argparse
import datetime
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADING = "## compile gate: what a follower still pays for, phase by phase"
SHAPES = dict(target_layers=64, hidden=64, tapped_layers=[1, 16, 31, 46, 61], draft_layers=2, block_size=4,
              seq_len=64, dtype="fp32", heads=4, kv_heads=2, vocab=256, batch=1, seed=0)  # tests/supervise.py


def cpu_s():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def child(role):
    """One process: the phases, as JSON on stdout."""
    phases, last = [], [cpu_s(), time.perf_counter()]
    start_wall = float(os.environ["SPLIT_T0"])
    phases.append(("interpreter start", last[0], last[1] - start_wall))

    def mark(name):
        c, w = cpu_s(), time.perf_counter()
        phases.append((name, c - last[0], w - last[1]))
        last[:] = [c, w]

    import torch
    mark("import torch")
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch._inductor.codecache  # noqa: F401
    sys.path.insert(0, str(ROOT / "python"))
    import dflash_launch
    dflash_launch.share_isa_probe()  # what the reference drafter does first
    mark("import Dynamo + Inductor")
    from torch._inductor import cpu_vec_isa
    isa = [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]
    picked = str(cpu_vec_isa.pick_vec_isa())
    mark("ISA probe")
    from dflash_launch.roles.reference_drafter import SyntheticSource, build
    torch.set_num_threads(1)
    c = dict(SHAPES, n_taps=5, hidden_shape=[1, 64, 320])
    model = build(c)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    sample = next(iter(SyntheticSource(c, 0, torch.float32)))
    mark("model + data")
    step = torch.compile(model.loss)
    mark("torch.compile() call")
    loss = step(sample["hidden"], sample["tokens"])
    loss.backward()
    opt.step()
    mark("first step (kernels load, fwd + bwd)")
    from torch._dynamo.utils import counters
    from dflash_launch.inductor import isa_verdict
    print(json.dumps({"phases": phases, "isa_verdicts": isa_verdict.stats(), "loss": loss.item(), "isa": isa, "picked": picked,
                      "bf16": bool(getattr(cpu_vec_isa.pick_vec_isa(), "_is_avx512_bf16_supported", False)),
                      "dynamo_hits": int(counters["dynamo_cache"]["dynamo_cache_hit"]),
                      "fx_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
                      "fx_misses": int(counters["inductor"]["fxgraph_cache_miss"])}))


def spawn(cache, role, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_VEC_ISA_OK", "DFLASH_ISA_SHARE")}
    (cache / ".dflash").mkdir(mode=0o700, exist_ok=True)  # the gate's dir, as dflash-worker makes it
    env.pop("TORCH_CACHING_PRECOMPILE", None)
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache),
               DFLASH_GATE_ROLE="lead" if role == "leader" else "reuse",
               TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1", SPLIT_T0=repr(time.perf_counter()),
               **(extra_env or {}))
    r = subprocess.run([sys.executable, __file__, "--child", role], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{role} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--followers", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    cache = pathlib.Path(tempfile.mkdtemp(prefix="follower_split_"))
    try:
        print("leader ...", file=sys.stderr, flush=True)
        leader = spawn(cache, "leader")
        runs = {"probe": [], "isa-ok": [], "shared": []}
        off = {"DFLASH_ISA_SHARE": "0"}
        for _ in range(args.followers):  # interleaved, so that the machine's load hits them alike
            print("followers ...", file=sys.stderr, flush=True)
            runs["probe"].append(spawn(cache, "follower", off))
            runs["isa-ok"].append(spawn(cache, "follower", {**off, "TORCHINDUCTOR_VEC_ISA_OK": "1"}))
            runs["shared"].append(spawn(cache, "follower"))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    names = [p[0] for p in leader["phases"]]
    med = lambda label, i, k: statistics.median(r["phases"][i][k] for r in runs[label])
    rows = []
    for i, name in enumerate(names):
        rows.append(f"| {name} | {leader['phases'][i][1]:.2f} | {med('probe', i, 1):.2f} | {med('probe', i, 2):.2f} | "
                    f"{med('isa-ok', i, 1):.2f} | {med('isa-ok', i, 2):.2f} | "
                    f"{med('shared', i, 1):.2f} | {med('shared', i, 2):.2f} |")
    tot = lambda label, k: statistics.median(sum(p[k] for p in r["phases"]) for r in runs[label])
    rows.append(f"| **whole process to first step** | {sum(p[1] for p in leader['phases']):.2f} | "
                f"{tot('probe', 1):.2f} | {tot('probe', 2):.2f} | {tot('isa-ok', 1):.2f} | {tot('isa-ok', 2):.2f} | "
                f"{tot('shared', 1):.2f} | {tot('shared', 2):.2f} |")
    same = all(r["loss"] == leader["loss"] for rs in runs.values() for r in rs)
    facts = {label: sorted({(tuple(r["isa"]), r["picked"], r["bf16"], r["dynamo_hits"], r["fx_hits"], r["fx_misses"],
                             r["isa_verdicts"]["isa_probes"], r["isa_verdicts"]["isa_shared"])
                            for r in rs}) for label, rs in runs.items()}
    load = os.getloadavg()
    cmd = "python3 bench/compile/follower_split.py " + " ".join(sys.argv[1:])
    md = f"""{HEADING}

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine shared with other work (load average {load[0]:.1f}
at the end), torch {__import__('torch').__version__} (CPU), {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}.
The reference drafter's step at the test shapes: a leader on a fresh cache dir compiles, then {args.followers}
followers of each kind (fresh processes, interleaved) trace their own code and hit its caches. CPU = user + sys of the process and its reaped children; medians over the followers.

| phase | leader CPU s | follower CPU s | wall s | follower, `TORCHINDUCTOR_VEC_ISA_OK=1`, CPU s | wall s | follower, shared verdicts, CPU s | wall s |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- Leader: ISAs {leader['isa']}, picked `{leader['picked']}`, avx512_bf16 {leader['bf16']}; dynamo hits
  {leader['dynamo_hits']}, fxgraph {leader['fx_hits']}/{leader['fx_misses']}.
- Leader's probes: {leader['isa_verdicts']['isa_probes']} (each recorded for the host's followers).
- Followers (ISAs, picked, bf16, dynamo hits, fxgraph hits, misses, ISA probes run, answered from a record): {facts}.
- Every follower's first loss equals the leader's: {same}.
"""
    print(md)
    if args.out:
        from benchmarks_md import write_section  # noqa: E402
        write_section(args.out, HEADING, md)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()

#!/usr/bin/env python3
"""What the cluster-wide compile gate saves: 2 simulated nodes (two `dflash-launch run --nnodes 2 --node-rank R`
on this host, each with its own EMPTY cache dir) x 3 gated reference drafters (real torch.compile, CPU), in one run:

  one      a single drafter compiling alone on a cold cache (the unit: "one compile")
  cluster  DFLASH_STORE set (a private redis-server): the cluster lease + the shipped cache archive (the worker
           also turns on Inductor's Redis remote caches); both nodes start together
  remote   Inductor's Redis remote caches alone (TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1,
           TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1, TORCHINDUCTOR_REDIS_HOST/PORT in the role's env), no store for
           dflash, no archive: each node's local gate; node 1 starts after node 0 is done (their best case: every
           FX entry is in Redis before node 1 looks)

CPU is each drafter's own rusage, self + children, from its start to its first compiled step
(TORCHINDUCTOR_COMPILE_THREADS=1 keeps the compile in-process and its g++ children reaped).

--vec-isa-ok adds TORCHINDUCTOR_VEC_ISA_OK=1 to every drafter (skips Inductor's per-process CPU ISA probe, ~1 s
of every follower's CPU; see "compile gate: what a follower still pays for" in docs/benchmarks.md) and writes its
own section.

--draft-layers N --hidden H run a bigger drafter than the demo shapes, in a section of its own.

Usage: python3 bench/cluster_gate/run_bench.py [--bin build/bin] [--out docs/benchmarks.md] [--vec-isa-ok]
       [--draft-layers N] [--hidden H]
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

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks_md import write_section  # noqa: E402
from redis_server import RedisServer  # noqa: E402
from supervise import SMALL_MODEL  # noqa: E402

MODEL = SMALL_MODEL


ISA_OK = ""


def config(d, n, extra_env=""):
    d.mkdir(parents=True)
    (d / "cache").mkdir(mode=0o700)
    env = 'DFLASH_STEPS = "1", TORCHINDUCTOR_COMPILE_THREADS = "1"' + ISA_OK + extra_env
    path = d / "run.toml"
    path.write_text(f'[run]\nname = "cg"\ncache_dir = "cache"\nlog_dir = "runs"\n{MODEL}\n'
                    f'[[role]]\nname = "drafter"\ncpu = {n}\n'
                    f'command = ["python", "-m", "dflash_launch.roles.reference_drafter"]\nenv = {{ {env} }}\n'
                    'gate = { timeout = "30m", mode = "serial" }\nready = { mode = "notify", timeout = "30m" }\n')
    return path


def launch(args, cfg, run_id, env, node=None):
    cmd = [str(args.bin / "dflash-launch"), "run", str(cfg), "--run-id", run_id, "--color", "never"]
    if node is not None:
        cmd += ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def collect(d, run_id, node=None):
    sub = f"runs/{run_id}" + (f"/node_{node}" if node is not None else "")
    s = json.loads((d / sub / "summary.json").read_text())
    out = []
    for p in s["processes"]:
        m, g = p["metrics"], p["gate"] or {}
        out.append({"name": p["name"], "node": node or 0, "role": g.get("role", "-"), "cluster": g.get("cluster", "-"),
                    "cpu": m["compile_cpu_s"], "ready": p["ready_s"], "hit": m["fxgraph_cache_hit"],
                    "miss": m["fxgraph_cache_miss"], "fetch_s": g.get("fetch_s"), "fetch_bytes": g.get("fetch_bytes")})
    return out, s["warnings"]


def check(p, what, d):
    if p.wait() != 0:
        sys.exit(f"{what} failed (exit {p.returncode}); logs in {d}")


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, default=ROOT / "build/bin")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--vec-isa-ok", action="store_true")
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    return ap.parse_args()


def set_shapes(args):
    """The drafter's shapes and the ISA switch, into what config() writes for every run."""
    global ISA_OK, MODEL
    MODEL = MODEL.replace("draft_layers = 2", f"draft_layers = {args.draft_layers}").replace(
        "hidden = 64", f"hidden = {args.hidden}")
    if args.vec_isa_ok:
        ISA_OK = ', TORCHINDUCTOR_VEC_ISA_OK = "1"'


def bench_one(args, work, base_env):
    """One drafter compiling alone on a cold cache: its CPU seconds are the unit."""
    print("one compile ...", file=sys.stderr)
    d = work / "one"
    check(launch(args, config(d, 1), "one", base_env), "one", d)
    one, _ = collect(d, "one")
    return one[0]["cpu"]


def bench_cluster(args, work, base_env, redis, rid):
    """The cluster gate: 2 nodes x 3 drafters started together on the store; (processes, warnings)."""
    print("cluster gate: 2 nodes x 3, started together ...", file=sys.stderr)
    secret = work / "run.secret"  # the run's secret the gate signs its archives with (0600)
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, os.urandom(16).hex().encode() + b"\n")
    os.close(fd)
    env = dict(base_env, DFLASH_STORE=redis.url, DFLASH_STORE_SECRET_FILE=str(secret),
               DFLASH_INDUCTOR_REMOTE_CACHE="1")  # as before the opt-in: the numbers stay comparable
    dirs = [work / f"cluster{r}" for r in (0, 1)]
    cfgs = [config(dirs[r], 3) for r in (0, 1)]
    ps = [launch(args, cfgs[r], rid + "-c", env, node=r) for r in (0, 1)]
    for r in (0, 1):
        check(ps[r], f"cluster node {r}", dirs[r])
    cluster, warnings = [], []
    for r in (0, 1):
        procs, w = collect(dirs[r], rid + "-c", r)
        cluster += procs
        warnings += w
    return cluster, warnings


def bench_remote(args, work, base_env, redis, rid):
    """Inductor's Redis remote caches alone, no store for dflash: node 0, then node 1; its processes."""
    print("Inductor's remote cache alone: node 0, then node 1 ...", file=sys.stderr)
    subprocess.run(["redis-cli", "-p", str(redis.port), "FLUSHALL"], check=True, stdout=subprocess.DEVNULL)
    remote_env = (', TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE = "1", TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE = "1", '
                  f'TORCHINDUCTOR_REDIS_HOST = "127.0.0.1", TORCHINDUCTOR_REDIS_PORT = "{redis.port}"')
    rdirs = [work / f"remote{r}" for r in (0, 1)]
    rcfgs = [config(rdirs[r], 3, remote_env) for r in (0, 1)]
    remote = []
    for r in (0, 1):
        check(launch(args, rcfgs[r], rid + "-r", base_env, node=r), f"remote node {r}", rdirs[r])
        remote += collect(rdirs[r], rid + "-r", r)[0]
    return remote


def table_rows(procs, unit):
    """One markdown table row per process."""
    return "\n".join(
        f"| {p['node']} | {p['name']} | {p['role']} | {p['cluster']} | {p['cpu']:.1f} | {p['cpu'] / unit:.2f}x | "
        f"{p['ready']:.1f} | {p['hit']}/{p['miss']} |" for p in procs)


def section_heading(args):
    heading = "## cluster gate" + (", TORCHINDUCTOR_VEC_ISA_OK=1" if args.vec_isa_ok else "")
    if (args.draft_layers, args.hidden) != (2, 64):
        heading += f", bigger drafter ({args.draft_layers} blocks, hidden {args.hidden})"
    return heading


def report(args, unit, cluster, warnings, remote):
    """The section for docs/benchmarks.md: both ways against one compile, each process in a table."""
    heading = section_heading(args)
    c_sum, r_sum = sum(p["cpu"] for p in cluster), sum(p["cpu"] for p in remote)
    leader = max(cluster, key=lambda p: p["miss"])
    n1 = [p for p in cluster if p["node"] != leader["node"]]
    fetched = [p for p in cluster if p["cluster"] == "fetched"]
    r_lead = [p for p in remote if p["role"] == "lead"]
    others = [p for p in cluster if p is not leader]
    same_node = [p["cpu"] for p in others if p["node"] == leader["node"]]
    floor = sum(p["cpu"] for p in others) / len(others) / unit
    shapes = ('the demo shapes of "compile gate" above' if (args.draft_layers, args.hidden) == (2, 64)
              else f"draft_layers = {args.draft_layers}, hidden = {args.hidden}, otherwise the demo shapes")
    verdict = "met" if c_sum / unit <= 1.5 else "not met"
    cmd = "python3 bench/cluster_gate/run_bench.py " + " ".join(sys.argv[1:])
    md = f"""{heading}

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine, torch {__import__('torch').__version__} (CPU),
redis-server {subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2][2:]}
on loopback. Two simulated nodes (two `dflash-launch run --nnodes 2 --node-rank R` on this host, each with its own
empty cache dir) x 3 reference drafters in gate mode `serial` ({shapes}), each until
its first compiled training step. CPU = each drafter's rusage (self + children) to its first step. Goal: the 6
together <= 1.5x one compile.

**Cluster gate** (`DFLASH_STORE` set; both nodes started together): **{c_sum:.1f} s = {c_sum / unit:.2f}x one compile
({unit:.1f} s)** for all 6. The leader ({leader['name']}, node {leader['node']}) {leader['cpu']:.1f} s; the other
node's processes {", ".join(f"{p['name']} {p['cpu']:.1f} s = {p['cpu'] / leader['cpu'] * 100:.0f}%" for p in n1)}
of the leader's; the fetch (archive {fetched[0]['fetch_bytes'] if fetched else 0} bytes, checked and imported)
took {fetched[0]['fetch_s'] if fetched else 0:.2f} s of wall. Warnings: {warnings or "none"}.

Goal {verdict}: every process but the leader costs what a *local* follower costs (here {floor * 100:.0f}% of one
compile on average; on the leader's own node {sum(same_node) / max(len(same_node), 1):.1f} s, on the other node
{sum(p["cpu"] for p in n1) / max(len(n1), 1):.1f} s), so the other node's compile is gone entirely and 6 processes cost
1 + 5 x {floor:.2f} = {1 + 5 * floor:.2f}x. The 1.5x goal would need a per-process floor of 10%; what that floor
is made of (imports, Dynamo re-tracing, Inductor's ISA probe, loading the kernels) is in "compile gate: what a
follower still pays for" above, and is paid by every process that calls torch.compile, warm cache or not.

| node | process | local gate | cluster | CPU s | / one compile | spawn to ready s | fxgraph hit/miss |
|---|---|---|---|---|---|---|---|
{table_rows(cluster, unit)}

**Inductor's Redis remote cache alone** (same run, no archive shipping; node 1 after node 0, its best case):
**{r_sum:.1f} s = {r_sum / unit:.2f}x one compile** for all 6; node 1's local leader
{", ".join(f"{p['name']} {p['cpu']:.1f} s = {p['cpu'] / r_lead[0]['cpu'] * 100:.0f}%" for p in r_lead[1:])} of node 0's
leader ({r_lead[0]['cpu']:.1f} s): its FX-graph lookups hit in Redis, but on CPU the C++ kernels are rebuilt.

| node | process | local gate | cluster | CPU s | / one compile | spawn to ready s | fxgraph hit/miss |
|---|---|---|---|---|---|---|---|
{table_rows(remote, unit)}

Ratio, same run: cluster gate / remote cache alone = {c_sum / r_sum:.2f}x the CPU.
"""
    return md


def main():
    args = parse_args()
    set_shapes(args)
    base_env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}")
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-cgate-"))
    redis = RedisServer(work / "redis").start()
    try:
        rid = f"cgb-{os.getpid()}"
        unit = bench_one(args, work, base_env)
        cluster, warnings = bench_cluster(args, work, base_env, redis, rid)
        remote = bench_remote(args, work, base_env, redis, rid)
    finally:
        redis.kill()
    shutil.rmtree(work, ignore_errors=True)
    md = report(args, unit, cluster, warnings, remote)
    print(md)
    if args.out:
        write_section(args.out, section_heading(args), md)


if __name__ == "__main__":
    main()

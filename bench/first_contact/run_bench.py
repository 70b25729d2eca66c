"""A newcomer's first `make demo` (issue 20): its two CPU-bound parts, each against what it replaced, in one run.

    .venv/bin/python bench/first_contact/run_bench.py [--out docs/benchmarks.md]   (the venv with torch)

1. The build of the six run binaries from scratch (no ccache, DFLASH_TESTS=OFF, -j nproc): unity-built shipped
   targets (DFLASH_UNITY=ON, the default) vs one TU per file (DFLASH_UNITY=OFF).
2. The demo run (configs/demo.toml on a fresh cache): the launcher's compile workers (the warm-up gets the host's,
   the followers one) vs TORCHINDUCTOR_COMPILE_THREADS=1 for every drafter, as configs/demo.toml had it.
The apt and pip phases are network-bound and not here; docs/benchmarks.md has the whole fresh-machine run.
"""
import argparse
import datetime
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchmarks_md import write_section  # noqa: E402

HEADING = "## first contact: the build and the run of `make demo`"
RUN_BINARIES = ["dflash-launch", "dflash-guardian", "dflash-worker", "dflash-builtin", "dflash-cachelock",
                "dflash-cachelock-run"]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd, **kw):
    """(wall s, CPU s of the command's reaped tree); raises on failure."""
    c0, t0 = children_cpu(), time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    return time.monotonic() - t0, children_cpu() - c0


def build(unity, torch_prefix, jobs):
    d = tempfile.mkdtemp(prefix=f"bench-build-{'unity' if unity else 'tu'}-")
    try:
        subprocess.run(["cmake", "-S", ROOT, "-B", d, "-G", "Ninja", "-DDFLASH_TESTS=OFF",
                        f"-DDFLASH_UNITY={'ON' if unity else 'OFF'}", f"-DCMAKE_PREFIX_PATH={torch_prefix}"],
                       check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, CCACHE_DISABLE="1")
        wall, cpu = timed(["ninja", "-C", d, "-j", str(jobs), *RUN_BINARIES], env=env, stdout=subprocess.DEVNULL)
        steps = sum(1 for _ in open(os.path.join(d, ".ninja_log"))) - 1
        return {"wall": wall, "cpu": cpu, "steps": steps}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def demo_run(bin_dir, one_thread):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-demo-"))
    try:
        text = (ROOT / "configs/demo.toml").read_text()
        text = text.replace('"../.cache/demo"', f'"{d}/cache"').replace('"../runs"', f'"{d}/runs"')
        if one_thread:
            old = 'env = { DFLASH_SOURCE = "spool", DFLASH_STEPS = "400" }'
            assert old in text, "configs/demo.toml's drafter env changed: update this bench"
            text = text.replace(old, old[:-2] + ', TORCHINDUCTOR_COMPILE_THREADS = "1" }')
        cfg = d / "demo.toml"
        cfg.write_text(text)
        env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
                   PYTHONPATH=str(ROOT / "python"))
        wall, cpu = timed([bin_dir / "dflash-launch", "run", cfg, "--run-id", "bench", "--color", "never"],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s = json.loads((d / "runs/bench/summary.json").read_text())
        (warm,) = s["warmups"]
        loads = [p["metrics"]["compile_wall_s"] for p in s["processes"] if p["role"] == "drafter"]
        misses = [p["metrics"]["fxgraph_cache_miss"] for p in s["processes"] if p["role"] == "drafter"]
        assert s["exit_code"] == 0 and misses == [0, 0, 0], (s["exit_code"], misses)
        return {"wall": wall, "cpu": cpu, "warmup": warm["gate"]["compile_s"], "load": sum(loads) / len(loads)}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    import torch
    jobs = os.cpu_count()
    b = {u: build(u, torch.utils.cmake_prefix_path, jobs) for u in (False, True)}
    r = {t: demo_run(ROOT / "build/bin", t) for t in (True, False)}
    load = os.getloadavg()
    md = f"""{HEADING}

`.venv/bin/python bench/first_contact/run_bench.py {' '.join(sys.argv[1:])}` — {datetime.date.today()}, this {jobs}-core
machine (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end), torch {torch.__version__} (CPU).
Build: the six run binaries from scratch, `ninja -j {jobs}`, no ccache, `DFLASH_TESTS=OFF`, Release `-O2`. Run:
`dflash-launch run configs/demo.toml` on a fresh cache (5 builtin targets, warm-up, 3 drafters x 400 steps).
CPU: user + sys of the reaped tree. Ratios: new / old, same run.

| part | old | new | wall s old -> new | ratio | CPU s old -> new |
|---|---|---|---|---|---|
| build | one TU per file ({b[False]['steps']} steps) | unity (`DFLASH_UNITY=ON`, {b[True]['steps']} steps) | {b[False]['wall']:.1f} -> {b[True]['wall']:.1f} | {b[True]['wall'] / b[False]['wall']:.2f}x | {b[False]['cpu']:.1f} -> {b[True]['cpu']:.1f} |
| demo run | `TORCHINDUCTOR_COMPILE_THREADS=1` | the launcher's (warm-up {jobs}, followers 1) | {r[True]['wall']:.1f} -> {r[False]['wall']:.1f} | {r[False]['wall'] / r[True]['wall']:.2f}x | {r[True]['cpu']:.1f} -> {r[False]['cpu']:.1f} |

- The warm-up's compile: {r[True]['warmup']:.1f} s -> {r[False]['warmup']:.1f} s; a follower's load (mean of 3):
  {r[True]['load']:.1f} s -> {r[False]['load']:.1f} s; every drafter 0 FX-graph misses in both.
"""
    print(md)
    if args.out:
        write_section(args.out, HEADING, md)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Runs every cachelock benchmark row in one go and prints the table with ratios.

    python3 bench/cachelock/run_bench.py [--build build] [--python .venv/bin/python] [--n 1000]

Rows: the gate (both levels, records, READY look) and the bare kernel locks it
is built on (cachelock_bench, C++), and the Python peers (peers.py: the PyPI
`filelock` package with its defaults, and a blocking fcntl.lockf). All in one
private temp dir on the same filesystem, one after another in the same run.
Ratios are peer / gate: how many times the gate is faster (higher is better).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    default_py = os.path.join(ROOT, ".venv", "bin", "python")
    ap.add_argument("--python", default=default_py if os.path.exists(default_py) else sys.executable)
    ap.add_argument("--n", type=int, default=1000, help="hand-offs per row (>= 1000 for the table)")
    ap.add_argument("--uncontended-n", type=int, default=10000)
    ap.add_argument("--out", help="also write the markdown table here")
    a = ap.parse_args()

    bench = os.path.join(a.build, "bin", "cachelock_bench")
    if not os.path.exists(bench):
        sys.exit(f"{bench} missing: build first (cmake --build {a.build} --target cachelock_bench)")
    if subprocess.run([a.python, "-c", "import filelock"], capture_output=True).returncode != 0:
        sys.exit(f"{a.python} cannot import filelock: pass --python with a venv that has it (pip install filelock)")
    filelock_version = subprocess.run([a.python, "-c", "import filelock; print(filelock.__version__)"],
                                      capture_output=True, text=True).stdout.strip()
    peers = os.path.join(HERE, "peers.py")

    rows = []
    with tempfile.TemporaryDirectory(prefix="cachelock-bench.") as d:
        os.chmod(d, 0o700)
        for impl in ("gate", "gate-reuse", "ofd", "sem"):
            rows.append(run([bench, "--what", "uncontended", "--impl", impl, "--n", str(a.uncontended_n), "--dir", d]))
        for impl in ("filelock", "lockf"):
            rows.append(run([a.python, peers, "--what", "uncontended", "--impl", impl, "--n", str(a.uncontended_n),
                             "--dir", d]))
        for impl in ("gate", "ofd", "sem"):
            rows.append(run([bench, "--what", "handoff", "--impl", impl, "--n", str(a.n), "--dir", d]))
        for impl in ("filelock", "lockf"):
            rows.append(run([a.python, peers, "--what", "handoff", "--impl", impl, "--n", str(a.n), "--dir", d]))

    names = {
        "gate": "dflash gate (named mutex + OFD lock + records)",
        "gate-reuse": "dflash gate, READY present (no lock)",
        "ofd": "bare fcntl OFD lock (C++, F_OFD_SETLKW)",
        "sem": "bare POSIX semaphore (C++)",
        "filelock": f"Python filelock {filelock_version} (defaults)",
        "lockf": "Python fcntl.lockf (blocking)",
    }
    gate = {r["what"]: r for r in rows if r["impl"] == "gate"}
    lines = [
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}; "
        f"hand-offs per row: {a.n}; uncontended ops per row: {a.uncontended_n}",
        "",
        "| what | lock | n | p50 µs | p99 µs | p50 ratio (peer/gate) | p99 ratio (peer/gate) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    us = lambda v: f"{v:.2f}" if v < 10 else f"{v:.1f}"
    for r in rows:
        g = gate[r["what"]]
        ratio = lambda k: "—" if r["impl"] == "gate" else f"{r[k] / max(g[k], 0.01):.2f}x"
        lines.append(f"| {r['what']} | {names[r['impl']]} | {r['n']} | {us(r['p50_us'])} | {us(r['p99_us'])} | "
                     f"{ratio('p50_us')} | {ratio('p99_us')} |")
    h = gate["handoff"]
    fl = next(r for r in rows if r["impl"] == "filelock" and r["what"] == "handoff")
    lines += [
        "",
        f"goal hand-off p99 <= 250 µs through both levels: {h['p99_us']:.1f} µs -> "
        f"{'met' if h['p99_us'] <= 250 else 'NOT met'}",
        f"goal >= 20x better than filelock (p99): {fl['p99_us'] / h['p99_us']:.0f}x -> "
        f"{'met' if fl['p99_us'] / h['p99_us'] >= 20 else 'NOT met'}",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

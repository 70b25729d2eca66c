"""One gated reference-drafter leader (the tests' [model], 3 steps, a fresh cache dir) three ways, back to back:
g++ itself, the suite's kernel store seeing each kernel for the first time, and the store with every kernel seen
(tests/kernel_store.py). Prints wall and CPU-s (user + sys of the launcher's whole tree) per way.

    PATH=build/bin:$PATH .venv/bin/python bench/kernel_store/one_leader.py
"""
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
sys.path.insert(0, str(ROOT / "tests"))
import kernel_store  # noqa: E402
from supervise import SMALL_MODEL, write_config  # noqa: E402

BODY = SMALL_MODEL + """
[[role]]
name = "drafter"
cpu = 1
command = ["python", "-m", "dflash_launch.roles.reference_drafter"]
env = { DFLASH_STEPS = "3" }
gate = { timeout = "10m", mode = "serial" }
ready = { mode = "notify", timeout = "10m" }
"""


def one_leader(label, env):
    d = pathlib.Path(tempfile.mkdtemp(prefix="kernel-store-bench-"))
    try:
        cfg = write_config(d, BODY)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        r = subprocess.run([shutil.which("dflash-launch", path=env["PATH"]), "run", str(cfg), "--run-id", "r"],
                           env=env, capture_output=True, text=True)
        wall = time.monotonic() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert r.returncode == 0, r.stderr[-2000:]
        (p,) = json.loads((d / "runs/r/summary.json").read_text())["processes"]
        assert p["gate"]["role"] == "lead" and p["metrics"]["fxgraph_cache_miss"] > 0, p
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        print(f"| {label} | {wall:.1f} s wall | {cpu:.1f} CPU-s |", flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    base = dict(os.environ, TORCHINDUCTOR_VEC_ISA_OK="1", PYTHONPATH=str(ROOT / "python"),
                PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    for k in ("DFLASH_TESTS_KERNEL_STORE_DIR", "DFLASH_TESTS_KERNEL_STORE_CXX", "DFLASH_TESTS_KERNEL_STORE_PY"):
        base.pop(k, None)
    one_leader("g++ itself", base)
    store_env = dict(base)
    store = kernel_store.setup(store_env)
    try:
        one_leader("kernel store, first sight of each kernel", store_env)
        one_leader("kernel store, every kernel seen", store_env)
        print("store:", "%d copies, %d g++ runs kept" % kernel_store.counts(store))
    finally:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()

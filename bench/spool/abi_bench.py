"""The Python spool through its public API only, so the same command measures any implementation of it (issue #56:
the package before and after it became classes over libdflash_spool.so, run back to back from two PYTHONPATHs).

    PYTHONPATH=python .venv/bin/python bench/spool/abi_bench.py [--dir /dev/shm] [--shape 1,64,320 --dtype fp32]
        [--frames 400] [--repeat 3]

One producer and one consumer in this process, frame after frame: publish, next_sample, a read of every page of
"hidden", ack (the next claim's sweep hands the file back: the ring's steady state). One JSON line per repeat and a
summary line (medians): frames/s of the loop, the producer's and the consumer's (next_sample + ack) microseconds
per frame, and, where the package loads libdflash_spool.so, the cost of one ctypes call (dfs_abi_version).
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

from dflash_launch.spool import SpoolProducer, SpoolSource

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def contract_for(shape, dtype):
    b, s, width = shape
    return {"batch": b, "seq_len": s, "hidden": width, "tapped_layers": [1], "dtype": dtype, "vocab": 32000,
            "target_layers": 4, "seed": 0}


def touch_pages(t):
    return int(t.reshape(-1).view(torch.uint8)[::4096].sum())


def one_run(args, contract, hidden, tokens):
    root = tempfile.mkdtemp(prefix="abi_bench.", dir=args.dir)
    try:
        spool = os.path.join(root, "s")
        p = SpoolProducer(spool, "t:0", contract, max_ready=1000, producers=1, max_bytes=1 << 40)
        s = SpoolSource(spool, "d:0", contract, producers=1)
        pub, con = [], []
        for i in range(args.frames + 2):
            if i == 2:
                t_start = time.perf_counter()
            t0 = time.perf_counter()
            p.publish(hidden, tokens)
            t1 = time.perf_counter()
            sample = s.next_sample()
            t2 = time.perf_counter()
            touch_pages(sample["hidden"])
            t3 = time.perf_counter()
            sample["ack"]()
            t4 = time.perf_counter()
            del sample
            if i >= 2:
                pub.append(t1 - t0)
                con.append((t2 - t1) + (t4 - t3))
        wall = time.perf_counter() - t_start
        p.finish()
        assert s.next_sample() is None
        s.release()
        return {"frames_per_s": args.frames / wall, "publish_us": statistics.median(pub) * 1e6,
                "consumer_us": statistics.median(con) * 1e6, "mappings_reused": s.stats()["mappings_reused"]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def ctypes_call_us():
    try:
        from dflash_launch.spool import _native
    except ImportError:
        return None
    lib = _native.lib()
    n = 200000
    t0 = time.perf_counter()
    for _ in range(n):
        lib.dfs_abi_version()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--shape", default="1,64,320", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    contract = contract_for(args.shape, args.dtype)
    g = torch.Generator().manual_seed(0)
    b, s, h = args.shape
    hidden = torch.randn(b, s, h, generator=g).to(DTYPES[args.dtype])
    tokens = torch.randint(0, contract["vocab"], (b, s), generator=g)
    mb = (hidden.numel() * hidden.element_size() + tokens.numel() * 8) / 1e6
    runs = []
    for _ in range(args.repeat):
        r = one_run(args, contract, hidden, tokens)
        runs.append(r)
        print(json.dumps(dict(label=args.label, frame_mb=round(mb, 3), **{k: round(v, 1) for k, v in r.items()})),
              flush=True)
    out = {k: round(statistics.median(r[k] for r in runs), 1) for k in ("frames_per_s", "publish_us", "consumer_us")}
    call = ctypes_call_us()
    print(json.dumps(dict(label=args.label, summary=True, frame_mb=round(mb, 3), frames=args.frames, **out,
                          ctypes_call_us=None if call is None else round(call, 3))), flush=True)


if __name__ == "__main__":
    main()

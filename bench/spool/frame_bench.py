"""The Python spool at a real frame's size (issue #49): per-frame consumer and producer time against a memcpy of
the frame in the same run, and frames/s end to end with producer and consumer processes against a plain copy.

    PYTHONPATH=python .venv/bin/python bench/spool/frame_bench.py [--dir /dev/shm] [--shape 1,2000,25600]
        [--dtype bf16] [--repeat 7] [--e2e-frames 6] [--producers 5] [--consumers 3]

One JSON object per line on stdout. Times are medians of --repeat.
- memcpy: torch copy_ of the frame's bytes into a preallocated tensor (the floor any consumer is held to).
- consumer (mapped): SpoolSource.next_sample (claim, map, header and contract check, token check) + a read of
  every page of "hidden" (the mapping faulted in: what the trainer's first read would pay) + ack.
- consumer (read+load): what SpoolSource did before (the same claim, every page read, ack): f.read() +
  safetensors.torch.load(bytes) + the token check.
- publish: SpoolProducer.publish (contract check, fallocate, one writev, rename) and, before, safetensors save
  to bytes + write().
- ring steady state: one producer and one consumer frame after frame, the ring of reused files on and off.
- e2e: P producer processes publish F frames each, C consumer processes take them (next_sample, every page
  read, ack), from a start signal every process waits for (torch imported) to the last exit; against one process that writes the same frame bytes to a
  file in the same directory and reads them back, frame after frame (spool_bench.cc's copy).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from dflash_launch.spool import SpoolProducer, SpoolSource, frame_bytes, frame_metadata, manifest
from dflash_launch.spool.format import check_frame, parse_header

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def contract_for(shape, dtype):
    b, s, width = shape
    return {"batch": b, "seq_len": s, "hidden": width, "tapped_layers": [1], "dtype": dtype, "vocab": 32000,
            "target_layers": 4, "seed": 0}


def frame(contract, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, s, h = contract["batch"], contract["seq_len"], contract["hidden"]
    hidden = torch.randn(b, s, h, generator=g).to(DTYPES[contract["dtype"]])
    return hidden, torch.randint(0, contract["vocab"], (b, s), generator=g)


class ReadLoadSource(SpoolSource):
    """SpoolSource as it read a frame before (the same claim and ack): f.read(), the header and contract checks
    on the bytes, safetensors.torch.load(bytes), the token check."""

    def _read(self, torch_, c):
        from safetensors.torch import load
        with open(c.path, "rb") as f:
            data = f.read()
        meta, tensors = parse_header(data)
        check_frame(self.contract, meta, tensors, c.file)
        t = load(data)
        bool(((t["tokens"] < 0) | (t["tokens"] >= self.contract["vocab"])).any())
        return t["hidden"], t["tokens"]


def touch_pages(t):
    """Reads one byte in every 4 KiB page of `t`: each mapped page faulted in, no compute pass."""
    return int(t.reshape(-1).view(torch.uint8)[::4096].sum())


def median_ms(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out), min(out), max(out)


def per_frame(args, contract):
    hidden, tokens = frame(contract)
    nbytes = hidden.numel() * hidden.element_size() + tokens.numel() * 8
    src_flat = hidden.reshape(-1).view(torch.uint8)
    dst = torch.empty_like(src_flat)
    dst.copy_(src_flat)  # pages of dst allocated before timing
    memcpy = median_ms(lambda: dst.copy_(src_flat), args.repeat)
    root = tempfile.mkdtemp(prefix="frame_bench.", dir=args.dir)
    try:
        p = SpoolProducer(os.path.join(root, "s"), "t:0", contract, max_ready=1000)
        publish = median_ms(lambda: p.publish(hidden, tokens), args.repeat)
        old_dir = os.path.join(root, "old")
        os.mkdir(old_dir)
        meta = dict(frame_metadata(contract), producer="t:0", seq="0")

        def old_publish():
            with open(os.path.join(old_dir, "f"), "wb") as f:
                f.write(frame_bytes(hidden, tokens, meta))
        old_pub = median_ms(old_publish, args.repeat)
        for _ in range(args.repeat):
            p.publish(hidden, tokens)  # frames for the read+load consumer
        src = SpoolSource(os.path.join(root, "s"), "d:0", contract, producers=1)

        def mapped():
            s = src.next_sample()
            touch_pages(s["hidden"])
            s["ack"]()
        consume = median_ms(mapped, args.repeat)
        old = ReadLoadSource(os.path.join(root, "s"), "d:1", contract, producers=1)

        def read_load():
            s = old.next_sample()
            touch_pages(s["hidden"])
            s["ack"]()
        old_consume = median_ms(read_load, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = nbytes / 1e6
    for what, (med, lo, hi) in (("memcpy", memcpy), ("consumer (mapped)", consume),
                                ("consumer (read+load, before)", old_consume), ("publish (writev)", publish),
                                ("publish (save+write, before)", old_pub)):
        print(json.dumps({"bench": "per_frame", "what": what, "frame_mb": round(mb, 1), "ms": round(med, 2),
                          "min_ms": round(lo, 2), "max_ms": round(hi, 2), "x_memcpy": round(med / memcpy[0], 2)}),
              flush=True)


def ring_steady_state(args, contract):
    """One producer and one consumer in this process, frame after frame (publish, then next_sample + a read of
    every page + ack + release()), the ring on (spool_ring.h: the acknowledged file goes back to the producer, the
    consumer keeps its mapping) and off (as before it: a new file and a new mapping per frame, each truncated
    after its ack), interleaved, against a memcpy in the same run. release() waits for the ack's truncate or
    rename, which a consumer's thread does in a run: here it is counted."""
    hidden, tokens = frame(contract)
    nbytes = hidden.numel() * hidden.element_size() + tokens.numel() * 8
    src_flat = hidden.reshape(-1).view(torch.uint8)
    dst = torch.empty_like(src_flat)
    dst.copy_(src_flat)
    root = tempfile.mkdtemp(prefix="frame_bench.", dir=args.dir)
    times = {k: [] for k in ("memcpy", "publish ring", "publish no ring", "consume ring", "consume no ring")}
    try:
        sides = {}
        for ring_on in (True, False):
            spool = os.path.join(root, "on" if ring_on else "off")
            os.environ["DFLASH_SPOOL_RING"] = "1" if ring_on else "0"  # off: no mapping kept, every ack truncates
            p = SpoolProducer(spool, "t:0", contract, max_ready=1000, producers=1)
            s = SpoolSource(spool, "d:0", contract, producers=1)
            sides[ring_on] = (p, s, spool)

        def one(ring_on, timed):
            p, s, spool = sides[ring_on]
            os.environ["DFLASH_SPOOL_RING"] = "1" if ring_on else "0"  # the library reads it at each ack
            tag = "ring" if ring_on else "no ring"
            t0 = time.perf_counter()
            p.publish(hidden, tokens)
            t1 = time.perf_counter()
            sample = s.next_sample()
            touch_pages(sample["hidden"])
            sample["ack"]()
            del sample
            s.release()
            t2 = time.perf_counter()
            if timed:
                times["publish " + tag].append((t1 - t0) * 1e3)
                times["consume " + tag].append((t2 - t1) * 1e3)
        one(True, False)
        one(False, False)
        for _ in range(args.repeat):
            one(True, True)
            one(False, True)
            t0 = time.perf_counter()
            dst.copy_(src_flat)
            times["memcpy"].append((time.perf_counter() - t0) * 1e3)
        reused = sides[True][1].stats()["mappings_reused"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    memcpy = statistics.median(times["memcpy"])
    for what, ts in times.items():
        med = statistics.median(ts)
        print(json.dumps({"bench": "ring_steady_state", "what": what, "frame_mb": round(nbytes / 1e6, 1),
                          "ms": round(med, 2), "min_ms": round(min(ts), 2), "max_ms": round(max(ts), 2),
                          "x_memcpy": round(med / memcpy, 2), "mappings_reused": reused}), flush=True)


def role_main(args):
    """One process of the e2e: --role producer:<i> or consumer:<i>."""
    contract = contract_for(args.shape, args.dtype)
    kind, i = args.role.split(":")
    hidden, tokens = frame(contract, int(i)) if kind == "producer" else (None, None)
    open(os.path.join(args.spool + ".start", args.role), "w").close()  # imported and ready: the clock may start
    while not os.path.exists(os.path.join(args.spool + ".start", "go")):
        time.sleep(0.001)
    if kind == "producer":
        p = SpoolProducer(args.spool, f"t:{i}", contract, producers=args.producers)
        for _ in range(args.e2e_frames):
            p.publish(hidden, tokens, check=True)
        p.finish()
    else:
        src = SpoolSource(args.spool, f"d:{i}", contract, producers=args.producers)
        for s in src:
            touch_pages(s["hidden"])
            s["ack"]()


def e2e(args, contract):
    hidden, tokens = frame(contract)
    data = frame_bytes(hidden, tokens, dict(frame_metadata(contract), producer="t:0", seq="0"))
    n = args.producers * args.e2e_frames
    spool_s, copy_s = [], []
    for _ in range(max(1, args.repeat // 2)):
        root = tempfile.mkdtemp(prefix="frame_bench.", dir=args.dir)
        try:
            path = os.path.join(root, "copy")
            t0 = time.perf_counter()
            for _ in range(n):
                with open(path, "wb") as f:
                    f.write(data)
                with open(path, "rb") as f:
                    f.read()
            copy_s.append(time.perf_counter() - t0)
            os.unlink(path)
            spool = os.path.join(root, "s")
            base = [sys.executable, __file__, "--spool", spool, "--shape", ",".join(map(str, args.shape)), "--dtype",
                    args.dtype, "--e2e-frames", str(args.e2e_frames), "--producers", str(args.producers)]
            start = spool + ".start"
            os.mkdir(start)
            procs = [subprocess.Popen(base + ["--role", f"producer:{i}"]) for i in range(args.producers)]
            procs += [subprocess.Popen(base + ["--role", f"consumer:{i}"]) for i in range(args.consumers)]
            while len(os.listdir(start)) < len(procs):  # every process imported torch and made its frame
                time.sleep(0.01)
            t0 = time.perf_counter()
            open(os.path.join(start, "go"), "w").close()
            codes = [p.wait() for p in procs]
            spool_s.append(time.perf_counter() - t0)
            m, final = manifest(spool, args.producers)
            assert codes == [0] * len(procs) and final and m["exactly_once"] and m["frames_consumed"] == n, (codes, m)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    s, c = statistics.median(spool_s), statistics.median(copy_s)
    print(json.dumps({"bench": "e2e", "frame_mb": round(len(data) / 1e6, 2), "producers": args.producers,
                      "consumers": args.consumers, "frames": n, "spool_frames_per_s": round(n / s, 2),
                      "copy_frames_per_s": round(n / c, 2), "ratio": round(c / s, 2),
                      "spool_s": [round(x, 2) for x in spool_s], "copy_s": [round(x, 2) for x in copy_s]}),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--shape", default="1,2000,25600", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--e2e-frames", type=int, default=6, help="frames per producer")
    ap.add_argument("--producers", type=int, default=5)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--skip", default="", help="per_frame, ring and/or e2e, comma separated")
    ap.add_argument("--role")
    ap.add_argument("--spool")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.role:
        return role_main(args)
    contract = contract_for(args.shape, args.dtype)
    skip = set(args.skip.split(","))
    if "per_frame" not in skip:
        per_frame(args, contract)
    if "ring" not in skip:
        ring_steady_state(args, contract)
    if "e2e" not in skip:
        e2e(args, contract)


if __name__ == "__main__":
    main()

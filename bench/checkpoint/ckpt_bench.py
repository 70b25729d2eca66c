"""What dflash_launch.Checkpoint costs a training loop (docs/benchmarks.md, "Checkpoints").

    python bench/checkpoint/ckpt_bench.py [--params-m 25] [--steps 60] [--every 20]

One process, CPU: an MLP of ~PARAMS_M million parameters, AdamW, STEPS steps; the median step time with no
checkpoint, with one every EVERY steps written asynchronously (dcp.async_save: the step waits for the copy only),
and written synchronously; then the time to restore the last one and the bytes of one checkpoint. Same process,
same model, interleaved order, so the ratios are what to read (the machine is shared)."""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from dflash_launch.checkpoint import Checkpoint  # noqa: E402


def model_of(params_m):
    width = int((params_m * 1e6 / 4) ** 0.5)
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]), width


def loop(args, mode, d):
    model, width = model_of(args.params_m)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = None if mode == "none" else Checkpoint(model, opt, every_steps=args.every, dir=d, keep=2,
                                                  async_save=mode == "async", say=lambda _: None)
    if ckpt:
        ckpt.restore()
    times = []
    x = torch.randn(8, width)
    for i in range(args.steps):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if ckpt:
            ckpt.step(i)
        times.append(time.perf_counter() - t0)
    blocked = None
    if ckpt:
        ckpt.finish()
        blocked = ckpt.save_blocked_s / max(1, ckpt.saved)
    return times, model, opt, blocked


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--params-m", type=float, default=25)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="ckpt-bench-")
    try:
        res = {}
        for mode in ("none", "async", "sync", "none", "async", "sync"):
            d = os.path.join(root, mode + str(len(res)))
            times, model, opt, blocked = loop(args, mode, d)
            res.setdefault(mode, []).append(times)
            if blocked is not None:
                res.setdefault("blocked_" + mode, []).append(blocked)
        steps = {m: v for m, v in res.items() if not m.startswith("blocked_")}
        mean = {m: statistics.mean(t for run in v for t in run) for m, v in steps.items()}
        med = {m: statistics.median(t for run in v for t in run) for m, v in steps.items()}
        n = sum(p.numel() for p in model_of(args.params_m)[0].parameters())
        print(f"model {n / 1e6:.1f}M params, {args.steps} steps, a checkpoint every {args.every} steps")
        for m in ("none", "async", "sync"):
            b = f"   a save holds the step {statistics.mean(res['blocked_' + m]) * 1e3:.0f} ms" if m != "none" else ""
            print(f"  {m:6s} mean step {mean[m] * 1e3:8.1f} ms ({mean[m] / mean['none']:.3f}x)   "
                  f"median {med[m] * 1e3:8.1f} ms{b}")
        d = os.path.join(root, "async1")
        last = sorted(x for x in os.listdir(d) if x.startswith("step-"))[-1]
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(d, last)) for f in fs)
        model, _ = model_of(args.params_m)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        t0 = time.perf_counter()
        Checkpoint(model, opt, every_steps=args.every, dir=d, say=lambda _: None).restore()
        print(f"  restore {time.perf_counter() - t0:.2f} s; one checkpoint {size / 2**20:.1f} MiB "
              f"(params + AdamW's two moments, fp32: {3 * n * 4 / 2**20:.1f} MiB)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

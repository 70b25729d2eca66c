"""What a warm-up (DFLASH_WARMUP=1) sees of the spool: synthetic frames of [model]
instead of real ones, and a stop after WARMUP_FRAMES if it never says READY."""

import os
import sys

#: Frames a warm-up gets (or publishes) before it is stopped if it has not said READY: a first compiled step
#: needs one; the second is what compiles on step 2 (an optimizer's state, a recompile on a new stride).
WARMUP_FRAMES = 2


class WarmupSpent(Exception):
    """A warm-up's frame budget is spent without READY: the warm-up has compiled what it can and should stop.
    Not a failure: `exit_code` 0 (dflash_launch/exit_codes.py ends an opted-in process with it, quietly); the
    explanation was said when it was raised."""

    __module__ = "dflash_launch.spool"
    exit_code = 0


def in_warmup(warmup):
    return os.environ.get("DFLASH_WARMUP") == "1" if warmup is None else bool(warmup)


def warmup_spent(who, n, what):
    """The end of a warm-up's budget: raises WarmupSpent, saying why first if it never said READY."""
    from dflash_launch import notify_status, said_ready

    if not said_ready():
        print(f"{who}: warm-up stopped after {n} {what} without saying READY. A warm-up "
              "(DFLASH_WARMUP=1) only compiles: the spool gives it synthetic frames of [model], never real ones, and "
              "takes nothing it publishes. Call dflash_launch.notify_ready() after the first compiled step (the "
              "warm-up then ends at once), and use dflash_launch.is_warmup() to skip what a warm-up need not do "
              "(checkpoints, evaluation); see docs/builtin.md, \"What a warm-up sees\".", file=sys.stderr, flush=True)
        notify_status(f"warm-up stopped after {n} frames without READY (call dflash_launch.notify_ready())")
    raise WarmupSpent(f"{who}: warm-up stopped after {n} {what}")


def synthetic_frame(torch, contract, g):
    c = contract
    b, s, width = c["batch"], c["seq_len"], len(c["tapped_layers"]) * c["hidden"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(c["dtype"], torch.float32)
    hidden = torch.randn(b, s, width, generator=g).to(dtype)
    # Never vocab-1, the drafters' mask token (neither do the builtin target's ids).
    return hidden, torch.randint(0, max(1, c["vocab"] - 1), (b, s), generator=g, dtype=torch.long)

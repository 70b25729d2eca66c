"""One rank of a 3-rank gloo DDP world that trains on a spool (tests/test_spool_world.py).

    python spool_rank.py ROOT RANK WORLD PORT SOURCE TAIL OUT TIMEOUT_S
SOURCE: "world" (dflash_launch.spool.world.WorldSource), "plain" (a SpoolSource per rank: what a DDP drafter had
before) or "checkpoint" (WorldSource and a dflash_launch.Checkpoint every CKPT_EVERY steps in OUT's dir/ckpt,
finish() after the loop as the reference drafter does). Writes OUT (JSON): the frames it stepped on, its step
count, a digest of its final weights, its stats.
The collectives time out after TIMEOUT_S, so a world whose ranks stepped unequally fails instead of hanging.
SLOW_RENAME_S: rank 0 sleeps that long before each rename into the checkpoint dir (a loaded machine, made certain:
rank 0 commits after its peers went on).
SPOOL_RANK_FAIL="R:N": rank R's spool raises OSError at its Nth claim (a disk error, not a bad frame)."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import contract_from_env, use_exit_codes
from dflash_launch.spool import SpoolSource
from dflash_launch.spool.world import WorldSource

use_exit_codes()  # sources built by hand below (not from_env): this script opts into exit 65 itself
root, rank, world, port, kind, tail, out, timeout_s = sys.argv[1:9]
rank, world = int(rank), int(world)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=float(timeout_s)))
contract = contract_from_env()
torch.manual_seed(0)
width = len(contract["tapped_layers"]) * contract["hidden"]
model = DDP(torch.nn.Linear(width, contract["vocab"]))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
name = f"drafter:{rank}"
if kind in ("world", "checkpoint"):
    source = WorldSource(SpoolSource(root, name, contract, producers=1), tail=tail)
else:
    source = SpoolSource(root, name, contract, producers=1)
fail = os.environ.get("SPOOL_RANK_FAIL", "")
if fail and int(fail.split(":")[0]) == rank:
    spool, claims = source.source if kind == "world" else source, []
    claim = spool.next_sample

    def failing_claim():
        claims.append(1)
        if len(claims) == int(fail.split(":")[1]):
            raise OSError(5, "Input/output error (injected)", str(root))
        return claim()
    spool.next_sample = failing_claim
ckpt = None
if kind == "checkpoint":
    from dflash_launch import Checkpoint
    slow = float(os.environ.get("SLOW_RENAME_S", "0"))
    if slow and rank == 0:
        import time
        rename = os.rename

        def slow_rename(src, dst):
            if ".tmp-step-" in str(src):
                time.sleep(slow)
            return rename(src, dst)
        os.rename = slow_rename
    ckpt = Checkpoint(model, opt, every_steps=int(os.environ.get("CKPT_EVERY", "2")),
                      dir=os.path.join(os.path.dirname(out), "ckpt"), source=source)
    ckpt.restore()
seen = []
for sample in source:
    logits = model(sample["hidden"].float())
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), sample["tokens"].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    seen.append({"frame": sample["frame"], "seq": sample["seq"], "padded": sample.get("padded", False),
                 "loss": loss.item()})
    if kind == "world" and rank == 0:
        sample["ack"](loss)  # rank 0 acknowledges (and records its loss); the others let the next frame do it
    elif kind == "plain":
        sample["ack"]()
    if ckpt is not None:
        ckpt.step(len(seen) - 1)
if ckpt is not None:
    ckpt.finish()  # after the source's own last checkpoint: nothing new, and every rank must agree on that
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
result = {"rank": rank, "steps": len(seen), "seen": seen, "weights_sum": float(weights.double().sum()),
          "stats": source.stats()}
with open(out, "w") as f:
    json.dump(result, f)
dist.barrier()  # every rank reaches the end: none is left in a collective
dist.destroy_process_group()

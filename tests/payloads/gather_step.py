"""A compiled step with a collective inside the graph: an all_gather whose output
shape is the world size. Traced in a world of one it would not match the real
world's graph; with dflash_launch.init_process_group(fake_world_in_warmup=True)
the warm-up traces it in torch's fake group of the real size. Writes Inductor's
counters to $DFLASH_METRICS_FILE."""
import json
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from dflash_launch import init_process_group, is_warmup, notify_ready
from leave_world import leave

rank, world = init_process_group("gloo", fake_world_in_warmup=os.environ.get("FAKE_WORLD") == "1")


@torch.compile
def step(x):
    return funcol.all_gather_tensor(torch.sin(x) * 2, 0, dist.group.WORLD).sum()


out = step(torch.full((4,), float(rank)))
from torch._dynamo.utils import counters
metrics = {k: int(counters["inductor"][k]) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
metrics.update(world=world, warmup=is_warmup())
with open(os.environ["DFLASH_METRICS_FILE"], "w") as f:
    json.dump(metrics, f)
notify_ready()
if not is_warmup():
    dist.barrier()
leave(0)

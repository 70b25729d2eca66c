"""An ML engineer's DDP drafter script, unmodified for dflash-launch: it joins the
role's world with plain torch.distributed (gloo, ROLE_* variables), wraps a model
in DistributedDataParallel, compiles its training step, says ready after the
first compiled step, trains a few steps and checks its peers with an all_reduce.
It writes Inductor's cache counters and the all_reduce sum to $DFLASH_METRICS_FILE."""
import json
import os
import sys

if os.environ.get("PER_RANK_CACHE") == "1":  # the usual workaround (pytorch#153791), for the benchmark
    os.environ["TORCHINDUCTOR_CACHE_DIR"] += f"/rank{os.environ['ROLE_RANK']}"

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import notify_ready

rank = int(os.environ["ROLE_RANK"])
world = int(os.environ["ROLE_WORLD_SIZE"])
dist.init_process_group(
    "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['ROLE_MASTER_PORT']}",
    rank=rank, world_size=world)
torch.manual_seed(0)
width = int(os.environ.get("DDP_WIDTH", "32"))
model = DDP(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile
def loss_of(x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def step():
    x, y = torch.randn(8, width), torch.randn(8, 1)
    loss = loss_of(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def write_metrics(**extra):
    from torch._dynamo.utils import counters
    metrics = {k: int(counters["inductor"][k]) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    metrics.update(world=world, warmup=os.environ.get("DFLASH_WARMUP") == "1", **extra)
    if os.environ.get("DFLASH_METRICS_FILE"):
        with open(os.environ["DFLASH_METRICS_FILE"] + ".tmp", "w") as f:
            json.dump(metrics, f)
        os.replace(os.environ["DFLASH_METRICS_FILE"] + ".tmp", os.environ["DFLASH_METRICS_FILE"])
    return metrics


step()
write_metrics()  # a warm-up is stopped once ready: its counters are on disk by then
notify_ready(f"rank {rank}: first compiled step done")
for _ in range(int(os.environ.get("DDP_STEPS", "3"))):
    step()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
metrics = write_metrics(all_reduce_sum=float(total.item()))
print(f"rank {rank}/{world}: {metrics}", flush=True)
dist.barrier()  # nobody tears gloo's pairs down under a peer still using them
dist.destroy_process_group()

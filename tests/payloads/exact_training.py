"""DDP and FSDP2 (fully_shard) on the role's world, each with a compiled step function (issue #37): 5 steps of each,
every rank on batches of its own, and each step's loss and this rank's gradient norm written as float.hex() to
$DFLASH_METRICS_FILE, so two runs compare bitwise. PRIVATE_CACHE=1 gives every rank a cache dir of its own (the
usual workaround, pytorch#153791): nothing shared, nothing loaded, the reference for a gated run."""
import json
import os

if os.environ.get("PRIVATE_CACHE") == "1":
    os.environ["TORCHINDUCTOR_CACHE_DIR"] += f"/rank{os.environ['ROLE_RANK']}"

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import init_process_group, notify_ready
from leave_world import leave

rank, world = init_process_group("gloo")
STEPS, WIDTH = 5, 16


def net():
    torch.manual_seed(0)  # every rank, and both runs, start from the same weights
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, 1))


def grad_norm(model):
    grads = [getattr(p.grad, "_local_tensor", p.grad) for p in model.parameters()]  # FSDP2: this rank's shard
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


def lookups():
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


def trainer(model, loss_of):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step_loss = torch.compile(loss_of)
    gen = torch.Generator().manual_seed(100 + rank)  # this rank's batches, the same in both runs

    def step():
        x, y = torch.randn(8, WIDTH, generator=gen), torch.randn(8, 1, generator=gen)
        before = lookups()
        loss = step_loss(x, y)
        opt.zero_grad()
        loss.backward()
        norm = grad_norm(model)
        opt.step()
        after = lookups()  # the first step: 0 FX-graph lookups if Dynamo's entry was loaded, misses if compiled here
        return {"loss": loss.item().hex(), "grad_norm": norm.hex(),
                "lookups": sum(after) - sum(before), "misses": after[1] - before[1]}
    return step


ddp, fsdp = DDP(net()), fully_shard(net())


def ddp_loss(x, y):  # one function each
    return torch.nn.functional.mse_loss(ddp(x), y)


def fsdp_loss(x, y):
    return torch.nn.functional.mse_loss(fsdp(x), y)


trainers = {"ddp": trainer(ddp, ddp_loss), "fsdp2": trainer(fsdp, fsdp_loss)}
steps = {name: [step()] for name, step in trainers.items()}  # the first steps compile
notify_ready(f"rank {rank}/{world}: compiled")
for name, step in trainers.items():
    steps[name] += [step() for _ in range(STEPS - 1)]
from torch._dynamo.utils import counters  # noqa: E402
metrics = {"steps": steps, "rank": rank, "world": world,
           "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
           "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
           "dynamo_cache_hit": int(counters["dynamo_cache"]["dynamo_cache_hit"])}
with open(os.environ["DFLASH_METRICS_FILE"] + ".tmp", "w") as f:
    json.dump(metrics, f)
os.replace(os.environ["DFLASH_METRICS_FILE"] + ".tmp", os.environ["DFLASH_METRICS_FILE"])
dist.barrier()
leave(0)

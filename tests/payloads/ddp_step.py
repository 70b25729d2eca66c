"""An ML engineer's DDP drafter script, unmodified for dflash-launch: it joins the
role's world with plain torch.distributed (gloo, ROLE_* variables), wraps a model
in DistributedDataParallel, compiles its training step, says ready after the
first compiled step, trains a few steps on batches of its own and checks its peers with an
all_reduce. It writes Inductor's and Dynamo's cache counters, the CPU its first (compiled) step
took, the all_reduce sum and whether every rank ended with the same weights (DDP synced the
gradients) to $DFLASH_METRICS_FILE.

DDP_MODEL=drafter (bench/ddp) swaps the toy MLP for a DFlash-drafter-shaped model:
fc(n_taps*hidden -> hidden), DDP_LAYERS decoder blocks (RMSNorm, causal SDPA, SiLU MLP,
each block's MLP its own width so its kernels differ, as a real model's layers do), a
head; narrow (hidden 64, seq 32) so running it is cheap and compiling it dominates."""
import json
import os
import resource

if os.environ.get("PER_RANK_CACHE") == "1":  # the usual workaround (pytorch#153791), for the benchmark
    os.environ["TORCHINDUCTOR_CACHE_DIR"] += f"/rank{os.environ['ROLE_RANK']}"

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import notify_ready
from leave_world import leave

rank = int(os.environ["ROLE_RANK"])
world = int(os.environ["ROLE_WORLD_SIZE"])
dist.init_process_group(
    "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['ROLE_MASTER_PORT']}",
    rank=rank, world_size=world)
torch.manual_seed(0)
width = int(os.environ.get("DDP_WIDTH", "32"))
SEQ, TAPS = 32, 5


class Block(torch.nn.Module):
    def __init__(self, i, h):
        super().__init__()
        self.h = h
        self.n1, self.n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.qkv, self.o = torch.nn.Linear(h, 3 * h, bias=False), torch.nn.Linear(h, h, bias=False)
        self.up = torch.nn.Linear(h, 4 * h + 8 * i, bias=False)
        self.down = torch.nn.Linear(4 * h + 8 * i, h, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(self.n1(x)).view(1, SEQ, 3, 4, self.h // 4).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(1, SEQ, self.h))
        return x + self.down(torch.nn.functional.silu(self.up(self.n2(x))))


if os.environ.get("DDP_MODEL") == "drafter":
    hidden = 64
    layers = [torch.nn.Linear(TAPS * hidden, hidden)]
    layers += [Block(i, hidden) for i in range(int(os.environ.get("DDP_LAYERS", "4")))]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1))
    batch = lambda: (torch.randn(1, SEQ, TAPS * hidden), torch.randn(1, SEQ, 1))  # noqa: E731
else:
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, 1))
    batch = lambda: (torch.randn(8, width), torch.randn(8, 1))  # noqa: E731
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
torch.manual_seed(1 + rank)  # each rank its own batches: only DDP's all-reduce keeps the weights equal


@torch.compile
def loss_of(x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def step():
    x, y = batch()
    loss = loss_of(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def write_metrics(**extra):
    from torch._dynamo.utils import counters
    metrics = {k: int(counters["inductor"][k]) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")}
    metrics.update({k: int(counters["dynamo_cache"][k]) for k in ("dynamo_cache_hit", "dynamo_cache_miss")})
    metrics.update(world=world, warmup=os.environ.get("DFLASH_WARMUP") == "1", **extra)
    if os.environ.get("DFLASH_METRICS_FILE"):
        with open(os.environ["DFLASH_METRICS_FILE"] + ".tmp", "w") as f:
            json.dump(metrics, f)
        os.replace(os.environ["DFLASH_METRICS_FILE"] + ".tmp", os.environ["DFLASH_METRICS_FILE"])
    return metrics


def cpu_s():  # this process and its reaped children (Inductor's g++ runs)
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


before = cpu_s()
step()
first_step_cpu_s = cpu_s() - before
write_metrics(first_step_cpu_s=first_step_cpu_s)  # a warm-up is stopped once ready: its counters are on disk by then
notify_ready(f"rank {rank}: first compiled step done")
for _ in range(int(os.environ.get("DDP_STEPS", "3"))):
    step()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
everyones = [torch.empty_like(weights) for _ in range(world)]
dist.all_gather(everyones, weights)
metrics = write_metrics(all_reduce_sum=float(total.item()), first_step_cpu_s=first_step_cpu_s,
                        weights_in_sync=all(torch.equal(w, weights) for w in everyones))
print(f"rank {rank}/{world}: {metrics}", flush=True)
dist.barrier()  # nobody tears gloo's pairs down under a peer still using them
leave(0)

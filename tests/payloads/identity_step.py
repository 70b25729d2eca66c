"""Compiled functions that read what makes this process itself (issue #37): its rank and world size (constant folds,
a ProcessGroup's methods), its environment (os.environ, os.getenv), a config module's attribute, a function chosen by
rank, a rank-dependent slice; and one that reads nothing of it. Each runs once compiled and once eager, and the
payload writes to $DFLASH_METRICS_FILE, per function: whether the two are bitwise equal, how many FX-graph lookups
(hits + misses) and misses its first call made in this process (0 lookups: Dynamo's precompile entry was loaded and
nothing traced; a miss: Inductor compiled it here). Matrix multiplications only (extern kernels): a function costs
Dynamo's trace and Inductor's Python, no C++ build, so a run of all of them stays short.

IDENTITY_WORLD=gloo joins the role's world (the gate's warm-up mode: its processes start together; a warm-up is a
world of one); IDENTITY_WORLD=fake joins torch's fake process group at the process's own rank and the role's size
(serial mode and the cluster gate: the processes take the gate one by one, none can wait for its peers)."""
import json
import os

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

import identity_conf
from dflash_launch import init_process_group, notify_ready
from leave_world import leave

rank, world = int(os.environ["ROLE_RANK"]), int(os.environ["ROLE_WORLD_SIZE"])
if os.environ.get("IDENTITY_WORLD") == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
else:
    init_process_group("gloo")  # the role's world (a warm-up's: a world of one)


def times(a, b):
    return torch.mm(a, b)


def times_swapped(a, b):
    return torch.mm(b, a)


PICK = times if rank % 2 == 0 else times_swapped  # a global that names another function in odd ranks


def rank_free(x, w):
    return torch.mm(x, w)


def world_and_rank(x, w):  # the x * world_size + rank, as one extern kernel
    return torch.addmm(x, x, w, beta=dist.get_world_size(), alpha=dist.get_rank() + 1)


def group_methods(x, w):
    return torch.addmm(x, x, w, beta=dist.group.WORLD.size(), alpha=dist.group.WORLD.rank() + 1)


def environ(x, w):
    return torch.addmm(x, x, w, alpha=int(os.environ["ROLE_RANK"]) + 1)


def getenv(x, w):  # os.getenv reads os.environ from the os module's globals, where Dynamo installs no guard
    return torch.addmm(x, x, w, alpha=int(os.getenv("ROLE_RANK")) + 1)


def module_attribute(x, w):
    return torch.addmm(x, x, w, alpha=identity_conf.RANK + 1)


def picked(x, w):
    return PICK(x, w)


def rank_slice(x, w):
    r = dist.get_rank() % 4
    return torch.mm(x[r:r + 1], w)


FUNCTIONS = [rank_free, world_and_rank, group_methods, environ, getenv, module_attribute, picked, rank_slice]


def lookups():
    ind = counters["inductor"]
    return int(ind["fxgraph_cache_hit"]), int(ind["fxgraph_cache_miss"])


x = torch.arange(16, dtype=torch.float32).reshape(4, 4) / 7
w = torch.arange(16, dtype=torch.float32).flip(0).reshape(4, 4) / 5
results = {}
for fn in FUNCTIONS:
    compiled = torch.compile(fn)
    (hits, misses) = lookups()
    out = compiled(x, w)
    hits2, misses2 = lookups()
    results[fn.__name__] = {"equal": torch.equal(out, fn(x, w)), "lookups": hits2 - hits + misses2 - misses,
                            "misses": misses2 - misses}
metrics = {"functions": results, "rank": rank, "world": world,
           "dynamo_cache_hit": int(counters["dynamo_cache"]["dynamo_cache_hit"])}
with open(os.environ["DFLASH_METRICS_FILE"] + ".tmp", "w") as f:
    json.dump(metrics, f)
os.replace(os.environ["DFLASH_METRICS_FILE"] + ".tmp", os.environ["DFLASH_METRICS_FILE"])
notify_ready(f"rank {rank}/{world}: {sum(r['equal'] for r in results.values())} of {len(results)} equal")
if os.environ.get("IDENTITY_WORLD") != "fake":
    dist.barrier()  # a warm-up's world of one, or the role's: nobody tears gloo down under a peer
leave(0)

"""A real torch.compile of one tiny training step (matmul, relu, backward) for tests about the cache tools, not
the model: it fills a real Inductor cache (FX graph, AOTAutograd, C++ kernels) in ~15 CPU-s where the reference
drafter takes ~45, writes the reference drafter's cache counters to $DFLASH_METRICS_FILE (what `seed --verify`
reads) and says READY."""
import json
import os

import torch

import dflash_launch
from dflash_launch.roles.reference_drafter import cache_counters


def step(x, w):
    return torch.relu(x @ w).sum()


dflash_launch.share_isa_probe()
# DFLASH_TEST_BARRIER=DIR:N: compile only once N processes got here (a test of processes that compile at once;
# on a loaded machine one could otherwise start after another's compile was already in the cache).
if os.environ.get("DFLASH_TEST_BARRIER"):
    import time
    where, n = os.environ["DFLASH_TEST_BARRIER"].rsplit(":", 1)
    open(os.path.join(where, str(os.getpid())), "w").close()
    while len(os.listdir(where)) < int(n):
        time.sleep(0.01)
x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
torch.compile(step)(x, w).backward()
with open(os.environ["DFLASH_METRICS_FILE"], "w") as f:
    json.dump(cache_counters(), f)
dflash_launch.notify_ready()

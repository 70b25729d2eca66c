"""A gated payload whose compiled function vectorizes: it computes the function compiled and eagerly, writes what it
computed, the vector ISA its Inductor picked, its cache key tag and the FX-graph cache's hits and misses to
$DFLASH_METRICS_FILE, then says READY (tests/test_cpu_identity.py). A process that loaded an entry compiled for
another ISA computes other values, or fails to build its kernels."""
import json
import os

import torch
from torch._dynamo.utils import counters

import dflash_launch

torch.manual_seed(0)
x, w = torch.randn(4, 64, 320), torch.randn(320)


def f(x, w):
    return (x * w).sum(-1).tanh() * 3 + (x.relu() * w).mean(-1)


compiled, eager = torch.compile(f)(x, w), f(x, w)
from torch._inductor.cpu_vec_isa import pick_vec_isa  # noqa: E402  (after the compile: what it used)

with open(os.environ["DFLASH_METRICS_FILE"], "w") as out:  # before READY: a leader's hits count as its proof
    json.dump({"equal": bool(torch.allclose(compiled, eager, rtol=1e-4, atol=1e-4)),
               "max_diff": float((compiled - eager).abs().max()),
               "isa": str(pick_vec_isa()), "tag": torch.compiler.config.cache_key_tag,
               "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
               "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"]}, out)
dflash_launch.notify_ready()

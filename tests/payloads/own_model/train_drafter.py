"""A SpecForge-shaped drafter script: its model lives in a module of its own
(drafter_model.py beside it), as real training scripts import theirs. It
compiles one forward step, writes Inductor's counters and gate_role() to
$DFLASH_METRICS_FILE, then says ready (a warm-up is stopped then)."""
import json
import os

import torch

from dflash_launch import gate_role, notify_ready
from drafter_model import Drafter

torch.manual_seed(0)
model = Drafter()
with torch.no_grad():
    out = torch.compile(model)(torch.randn(2, 8, 16))
c = torch._dynamo.utils.counters
metrics = {"fxgraph_cache_miss": c["inductor"]["fxgraph_cache_miss"],
           "fxgraph_cache_hit": c["inductor"]["fxgraph_cache_hit"],
           "dynamo_cache_hit": c["dynamo_cache"]["dynamo_cache_hit"],
           "gate_role": gate_role(), "out": float(out.sum())}
path = os.environ["DFLASH_METRICS_FILE"]
with open(path + ".tmp", "w") as f:
    json.dump(metrics, f)
os.replace(path + ".tmp", path)
notify_ready()

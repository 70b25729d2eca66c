"""A drafter of the stack: the reference DFlash drafter (dflash_launch.roles.reference_drafter) in the role's DDP
world (gloo), its compiled step behind the compile gate. Each step asks a target server for the hidden
states of one sample over HTTP (servers from DFLASH_TARGET_HTTP_PORTS, round robin), takes the tensor out of
the store, and trains on it. A server that is away (restarting) is retried on the next one, then again,
within STACK_RETRY_S; past that the drafter fails and its restart policy decides.

In a warm-up (DFLASH_WARMUP=1) it never touches the servers: one step on synthetic data of the same shapes
compiles the same graphs. Writes its metrics (steps, losses, the servers it used, cache counters) to
$DFLASH_METRICS_FILE."""
import json
import os
import sys
import time
import urllib.request

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import (contract_from_env, init_process_group, is_warmup, notify_ready, notify_status,
                           share_isa_probe)
from dflash_launch.roles.reference_drafter import SyntheticSource, build, cache_counters, write_metrics
from resp import Redis

share_isa_probe()  # a gated follower answers Inductor's ISA probe from the host's record (docs/cachelock.md)

contract = contract_from_env()
if not contract:
    sys.exit("drafter: run me under dflash-launch")
name = os.environ.get("DFLASH_PROCESS", "drafter")
steps = 1 if is_warmup() else int(os.environ.get("STACK_STEPS", "8"))
retry_s = float(os.environ.get("STACK_RETRY_S", "60"))
password = open(os.environ["STACK_PASSWORD_FILE"]).read().strip() if os.environ.get("STACK_PASSWORD_FILE") else None
torch.set_num_threads(1)
rank, world = init_process_group("gloo", world="role")
model = build(contract)
ddp = DDP(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)


@torch.compile
def step_loss(hidden, tokens):
    logits = ddp(hidden, tokens)
    ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="none")
    return (ce.view(tokens.shape) * model.weights).sum() / (model.weights.sum() * tokens.shape[0])


class ServerSource:
    """Samples rank, rank + world, ... from the target servers, bulk through the store."""

    def __init__(self):
        self.servers = os.environ["DFLASH_TARGET_HTTP_PORTS"].split(",")
        self.store_port = os.environ["DFLASH_STORE_REDIS_PORTS"].split(",")[0]
        self.used, self.retries, self.turn = {}, 0, rank

    def fetch(self, sample):
        deadline = time.monotonic() + retry_s
        while True:
            port = self.servers[self.turn % len(self.servers)]
            self.turn += 1
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/hidden?sample={sample}", timeout=30) as r:
                    meta = json.loads(r.read())
                store = Redis(self.store_port, password=password)
                data = store.cmd("GET", meta["key"])
                store.cmd("DEL", meta["key"])
                store.close()
                if data is None:
                    raise ConnectionError(f"{meta['key']} is not in the store")
                self.used[port] = self.used.get(port, 0) + 1
                hidden = torch.frombuffer(bytearray(data), dtype=torch.float32).view(meta["shape"])
                return hidden, torch.tensor(meta["tokens"])
            except (OSError, ConnectionError, ValueError) as e:
                self.retries += 1
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: no target server answered within {retry_s:.0f}s: {e}")
                notify_status(f"target server on port {port} is away ({e}); trying the next")
                time.sleep(0.2)

    def __iter__(self):
        sample = rank
        while True:
            yield self.fetch(sample)
            sample += world


servers = None if is_warmup() else ServerSource()
if servers is None:
    source = ((s["hidden"], s["tokens"]) for s in SyntheticSource(contract, rank, torch.float32))
else:
    source = iter(servers)
losses = []
for step in range(steps):
    hidden, tokens = next(source)
    loss = step_loss(hidden, tokens)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(round(loss.item(), 4))
    if step == 0:
        counters = cache_counters()
        notify_ready(f"rank {rank}/{world}: first compiled step done")
metrics = {"process": name, "steps": len(losses), "losses": losses, **counters}
if servers is not None:
    metrics.update(servers=servers.used, retries=servers.retries)
write_metrics(os.environ.get("DFLASH_METRICS_FILE", ""), metrics)
print(f"{name}: {len(losses)} steps, loss {losses[0]} -> {losses[-1]}", flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()

"""A rank of one gloo world spanning every role (MASTER_ADDR/MASTER_PORT): all-reduces
in a loop. $FAIL_PROCESS on attempt 0 exits $FAIL_CODE after a few steps; its peers
then fail on their next collective (exit 1, "Connection closed by peer"), as a real
torch.distributed world does, after the supervisor has recorded that first failure. Exits 0 after $STEPS steps otherwise."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from leave_world import leave

env = os.environ
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
me, attempt = env["DFLASH_PROCESS"], int(env["DFLASH_ATTEMPT"])
fail = me == env.get("FAIL_PROCESS") and attempt == 0
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
for step in range(int(env.get("STEPS", "100000"))):
    t = torch.tensor([1.0])
    try:
        dist.all_reduce(t)
    except Exception as e:  # a peer is gone: this rank cannot go on
        print(f"{me}: step {step}: {e}", file=sys.stderr, flush=True)
        # In a real world the peers fail seconds later (a collective's timeout);
        # here, once the supervisor has recorded the failure that started it.
        events, deadline = os.path.join(env["DFLASH_RUN_DIR"], "events.jsonl"), time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(events) as f:
                if any(f'"{env.get("FAIL_PROCESS")}"' in line and '"to":"BACKOFF"' in line for line in f):
                    break
            time.sleep(0.02)
        sys.exit(1)
    if fail and step == 3:
        print(f"{me}: failing on purpose with {env['FAIL_CODE']}", flush=True)
        os._exit(int(env["FAIL_CODE"]))
    time.sleep(0.05)
dist.barrier()
leave(0)

"""A payload that proves which world it is in: a gloo all_reduce over WORLD_SIZE
ranks (MASTER_ADDR/MASTER_PORT), and a role-only TCPStore (ROLE_MASTER_ADDR/
ROLE_MASTER_PORT) where every role rank writes its run id and reads all the others'.
Writes <out_dir>/<DFLASH_RUN_ID>.<RANK>.json; exits 3 if anything is off."""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from leave_world import leave

out_dir = sys.argv[1]
env = os.environ
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
role_rank, role_world = int(env["ROLE_RANK"]), int(env["ROLE_WORLD_SIZE"])
run_id = env["DFLASH_RUN_ID"]
timeout = datetime.timedelta(seconds=60)

dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# Every rank also contributes its run id's hash: a rank of another run would change it.
h = torch.tensor([float(sum(run_id.encode()) % 1000)])
dist.all_reduce(h)

store = dist.TCPStore(env["ROLE_MASTER_ADDR"], int(env["ROLE_MASTER_PORT"]), role_world,
                      is_master=role_rank == 0, timeout=timeout)
store.set(f"rank{role_rank}", run_id)
store.wait([f"rank{i}" for i in range(role_world)])
peers = [store.get(f"rank{i}").decode() for i in range(role_world)]
dist.barrier()  # the role store's owner (role rank 0) stays up until every peer has read it

result = {"rank": rank, "world": world, "sum": t.item(), "run_hash_sum": h.item(),
          "role": env["ROLE_NAME"], "role_rank": role_rank, "role_world": role_world, "role_peers": peers,
          "local_world_size": int(env["LOCAL_WORLD_SIZE"]), "local_rank": int(env["LOCAL_RANK"]),
          "node_rank": int(env["DFLASH_NODE_RANK"]), "omp": env.get("OMP_NUM_THREADS"),
          "master_port": int(env["MASTER_PORT"]), "role_master_port": int(env["ROLE_MASTER_PORT"])}
with open(os.path.join(out_dir, f"{run_id}.{rank}.json"), "w") as f:
    json.dump(result, f)
ok = t.item() == world * (world + 1) / 2 and peers == [run_id] * role_world
leave(0 if ok else 3)

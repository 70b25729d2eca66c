"""One rank of a gloo world that trains on the spool with dflash_launch.Checkpoint (tests/test_checkpoint.py).

A small model with dropout (so the RNG states matter), AdamW, DDP (CKPT_WRAP=ddp, default) or FSDP2 (fsdp2),
WorldSource, a checkpoint every CKPT_EVERY steps. At the end rank 0 writes the final weights (CKPT_OUT, torch.save)
and every rank the frames it stepped on (CKPT_OUT.<rank>.json).

CKPT_KILL="RANK:MOMENT:STEP[;RANK:MOMENT:STEP...]": the k-th kills rank RANK with SIGKILL in attempt k
(DFLASH_ATTEMPT=k; every rank of the world restarts with the one killed, so they count attempts together):
  step    mid-step: after step STEP's backward, before its optimizer step
  write   mid-checkpoint-write: the checkpoint of STEP steps has this rank's data on disk, not yet committed
  commit  just after the commit: checkpoint STEP renamed into place, its frames not yet moved to done/ (rank 0)
CKPT_SLEEP_MS: a pause per step (a kill from outside lands mid-run). CKPT_STOP_SIGNALS: the Checkpoint's stop_signals
("SIGTERM,SIGUSR1"; default SIGTERM). CKPT_DAMAGE=1 with a "commit" kill: the checkpoint's .distcp files are truncated
before the kill (a disk that lost them: a checkpoint that cannot be loaded, whose frames were never committed)."""
import json
import os
import signal
import time

import torch

from dflash_launch import Checkpoint, contract_from_env, init_process_group
from dflash_launch.spool.world import WorldSource

torch.set_num_threads(1)
contract = contract_from_env()
init_process_group("gloo")
rank = torch.distributed.get_rank()
kills = [k.split(":") for k in os.environ.get("CKPT_KILL", "").split(";") if k]
attempt = int(os.environ.get("DFLASH_ATTEMPT", "0"))
victim, moment, at = kills[attempt] if attempt < len(kills) else ("-1", "", "-1")
armed = int(victim) == rank
at = int(at) if armed else -1


def die(why):
    print(f"ckpt_rank {rank}: SIGKILL {why}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


torch.manual_seed(0)
width = len(contract["tapped_layers"]) * contract["hidden"]
model = torch.nn.Sequential(torch.nn.Linear(width, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(32, contract["vocab"]))
if os.environ.get("CKPT_WRAP", "ddp") == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    for layer in (model[0], model[3]):
        fully_shard(layer)
    fully_shard(model)
    wrapped = model
else:
    # DDP's defaults: the checkpoint carries its rebuilt buckets (docs/checkpoints.md, "Bitwise").
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
source = WorldSource.from_env(contract)
ckpt = Checkpoint(wrapped, opt, every_steps=int(os.environ.get("CKPT_EVERY", "3")), source=source,
                  async_save=os.environ.get("CKPT_ASYNC", "1") == "1",
                  stop_signals=[getattr(signal, n) for n in os.environ.get("CKPT_STOP_SIGNALS", "SIGTERM").split(",")])

if armed and moment == "write":
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    write_data = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        done = write_data(self, plan, planner)
        if f"step-{at:010d}" in str(self.path):
            done.wait()
            die(f"with its part of {self.path} written")
        return done
    FileSystemWriter.write_data = write_then_die
if armed and moment == "commit":
    commit = source.commit

    def die_before_frames(positions, checkpoint):
        if checkpoint.endswith(f"step-{at:010d}"):
            if os.environ.get("CKPT_DAMAGE") == "1":
                for f in os.listdir(checkpoint):
                    if f.endswith(".distcp"):
                        os.truncate(os.path.join(checkpoint, f), 100)
            die(f"after {checkpoint} was renamed into place, before its frames were committed")
        return commit(positions, checkpoint)
    source.commit = die_before_frames

start = ckpt.restore()
seen = []
pause = float(os.environ.get("CKPT_SLEEP_MS", "0")) / 1000
for step, sample in enumerate(source, start):
    logits = wrapped(sample["hidden"].float())
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), sample["tokens"].flatten())
    loss.backward()
    if armed and moment == "step" and step == at:
        die(f"mid-step {step}")
    opt.step()
    opt.zero_grad()
    sample["ack"](loss.detach())
    seen.append([step, sample["frame"], bool(sample.get("padded"))])
    ckpt.step(step)
    if os.environ.get("CKPT_TRACE") and rank == 0:
        import hashlib
        h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12]
        st = opt.state[next(iter(model.parameters()))]
        print(f"TRACE {step} {sample['frame']} {h} {float(loss):.9f} {st['step'].item()} "
              f"{hashlib.sha256(st['exp_avg_sq'].numpy().tobytes()).hexdigest()[:8]} {torch.get_rng_state().sum()}", flush=True)
    time.sleep(pause)
out = os.environ.get("CKPT_OUT")
if out:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, out)
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump({"start": start, "seen": seen, "stats": source.stats()}, f)
torch.distributed.barrier()
torch.distributed.destroy_process_group()

"""Your own DDP drafter on the hidden-state spool, with no glue: the rank joins its role's world, wraps its
model in DistributedDataParallel, and reads frames through WorldSource, which gives every rank the same number of
steps (the last round of fewer frames than ranks is padded: docs/builtin.md, "A DDP world on the spool") and
acknowledges each frame once its step has run. `sample["ack"](loss)` records the loss for the run's summary
(the training table and runs/<run_id>/loss.svg); without it the next frame acknowledges the last.

It checkpoints: dflash_launch.Checkpoint every 5 steps in $DFLASH_CHECKPOINT_DIR (<run dir>/checkpoints/drafter),
each checkpoint committing the frames it trained on; a world restarted after a failure resumes from the last one
and is dealt the frames after it again, in the same order (docs/checkpoints.md).

The model is a stand-in for yours: fc over the concatenated taps, an RMSNorm, the target's LM head (shared,
frozen), next-token cross-entropy. torch.compile'd behind the compile gate: a warm-up compiles it in a world of
one (the source gives it synthetic frames of [model]), then the three ranks start on its cache."""
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_launch import Checkpoint, contract_from_env, init_process_group, notify_ready, share_isa_probe
from dflash_launch.spool.world import WorldSource

share_isa_probe()  # a gated follower answers Inductor's ISA probe from the host's record (docs/cachelock.md)

contract = contract_from_env()
cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
torch.set_num_threads(1)
init_process_group("nccl" if cuda else "gloo")  # the role's world: world = "role" in run.toml
source = WorldSource.from_env(contract)          # on every rank, at the same point


class Drafter(torch.nn.Module):
    def __init__(self, c, lm_head):
        super().__init__()
        self.fc = torch.nn.Linear(len(c["tapped_layers"]) * c["hidden"], c["hidden"], bias=False)
        self.norm = torch.nn.RMSNorm(c["hidden"])
        self.head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.head.weight = torch.nn.Parameter(lm_head, requires_grad=False)  # the target's, frozen

    def forward(self, hidden, tokens):
        logits = self.head(self.norm(self.fc(hidden.float())))
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


model = DDP(Drafter(contract, source.shared_weights()["lm_head.weight"]).to(device),
            device_ids=[0] if cuda else None)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=float(os.environ.get("LR", "1e-2")))
step = torch.compile(model)
ckpt = Checkpoint(model, opt, every_steps=5, source=source)  # a warm-up neither restores nor saves
start = ckpt.restore()                                        # 0, or the step of the last checkpoint
for i, sample in enumerate(source, start):
    loss = step(sample["hidden"].to(device), sample["tokens"].to(device))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sample["ack"](loss)
    ckpt.step(i)
    if i == start:
        notify_ready()  # compiled: the gate publishes the cache (a warm-up ends here)
torch.distributed.destroy_process_group()

"""A drafter at toy size for the tests about the gate's mechanics (who leads, who waits and reuses, a leader killed
mid-compile, the cluster's hand-over), not the model: the reference drafter's order of things on a small real graph.
DFLASH_STEPS (default 3; 1 in a warm-up) steps of a torch.compile'd training step (linear, layer norm, gelu, softmax,
cross-entropy and their backward; SGD), READY after the first one; its Inductor cache counters, gate_role(), steps and
compile_cpu_s (this process's CPU and its reaped children's up to READY, as the reference drafter counts it) in
$DFLASH_METRICS_FILE. Its compile makes a few C++ kernels: with g++ itself (conftest.with_real_compiler) it goes on for
seconds after Inductor's first cache entry (~15 s measured on a loaded machine; ~2 s with the suite's kernel store)."""
import json
import os
import resource

import torch

import dflash_launch
from dflash_launch.roles.reference_drafter import cache_counters


def cpu_seconds():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.out = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.norm(self.fc(x)))
        logits = self.out(h * torch.softmax(h, dim=-1))
        return torch.nn.functional.cross_entropy(logits, y)


def main():
    steps = 1 if os.environ.get("DFLASH_WARMUP") == "1" else int(os.environ.get("DFLASH_STEPS", "3"))
    dflash_launch.share_isa_probe()
    cpu_start = cpu_seconds()
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step_loss = torch.compile(model)
    metrics = {"gate_role": dflash_launch.gate_role()}
    path = os.environ["DFLASH_METRICS_FILE"]

    def write():
        with open(path + ".tmp", "w") as f:
            json.dump(metrics, f)
        os.replace(path + ".tmp", path)

    for step in range(steps):
        loss = step_loss(torch.randn(4, 16), torch.randint(0, 8, (4,)))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        metrics["steps"] = step + 1
        if step == 0:
            metrics.update(cache_counters(), compile_cpu_s=round(cpu_seconds() - cpu_start, 3))
            write()
            dflash_launch.notify_ready()
    metrics.update(cache_counters())
    write()


if __name__ == "__main__":
    main()

"""A script that reports only through TrainingMetrics, as docs/summary-json.md shows it (issue #47 item 3): a real
torch.compile of one tiny training step, metrics.step(loss), READY. No counters of its own: TrainingMetrics writes
the compile counters that `seed --verify` reads."""
import torch

import dflash_launch
from dflash_launch.train_metrics import TrainingMetrics


def step(x, w):
    return torch.relu(x @ w).sum()


metrics = TrainingMetrics()
x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
loss = torch.compile(step)(x, w)
loss.backward()
metrics.step(loss)
dflash_launch.notify_ready()
metrics.write()

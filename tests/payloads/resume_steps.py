"""A training loop with dflash_launch.Checkpoint and TrainingMetrics and no spool (tests/test_metrics.py): STEPS
steps of STEP_S seconds, a checkpoint every EVERY steps. The first time it reaches step KILL_AT (KILL_MARK does not
exist yet) it waits for the file KILL_MARK.go (the test saw its metrics), makes KILL_MARK and kills itself with
SIGKILL, mid-step, after its last checkpoint. Resumed, it waits for KILL_MARK.resume.go before its first step."""
import os
import signal
import time

import torch

from dflash_launch import Checkpoint, TrainingMetrics

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
metrics = TrainingMetrics(every_s=0.2)
ckpt = Checkpoint(model, opt, every_steps=int(os.environ["EVERY"]), metrics=metrics, async_save=False)
start = ckpt.restore()
mark = os.environ["KILL_MARK"]
while os.path.exists(mark) and not os.path.exists(mark + ".resume.go"):  # resumed: until the test saw it
    time.sleep(0.05)
for step in range(start, int(os.environ["STEPS"])):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    loss.backward()
    if step == int(os.environ["KILL_AT"]) and not os.path.exists(mark):
        while not os.path.exists(mark + ".go"):
            time.sleep(0.05)
        open(mark, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    opt.step()
    opt.zero_grad()
    metrics.step(loss)
    ckpt.step(step)
    time.sleep(float(os.environ["STEP_S"]))
ckpt.finish()
metrics.write()

"""Bitwise DDP resume with DDP's defaults (issue #59 item 7, dflash_launch/ddp_buckets.py): a world of 3 gloo ranks
on CPU trains a DistributedDataParallel built with no argument (no find_unused_parameters), is killed -9 mid-step,
and resumes from its checkpoint; every parameter and AdamW tensor then equals the run never killed, bit for bit
(torch.equal). DDP rebuilds its gradient buckets after its first step, in the order the gradients became ready; the
checkpoint carries that layout and restore() builds the resumed reducer with it. The revert check runs the same
world with ddp_buckets.apply made a no-op (the code before the fix): the last bits differ.

3 ranks, not 2: a sum of two gradients is the same in either order (IEEE addition commutes), so a 2-rank world is
bitwise whatever the layout; 3 summands round differently by their order (gloo's ring starts each chunk's sum at
another rank, and an element's chunk is its offset in the bucket)."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from redis_server import free_port
from test_spool import ENV

WORLD = 3
RANK = """
import datetime, os, signal, sys, torch, torch.distributed as dist
import dflash_launch.ddp_buckets
from dflash_launch import Checkpoint
rank, port, ck_dir, kill_at, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
if os.environ.get("LAYOUT_OFF") == "1":  # the revert check: the resumed reducer keeps DDP's initial buckets
    dflash_launch.ddp_buckets.apply = lambda model, buckets: None
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=%(world)d,
                        timeout=datetime.timedelta(seconds=120))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4))
ddp = torch.nn.parallel.DistributedDataParallel(model)  # DDP's defaults: its buckets are rebuilt after step 0
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ck = Checkpoint(ddp, opt, every_steps=2, dir=ck_dir, async_save=False, env={})
start = ck.restore()
for step in range(start, 8):
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank's batch of each step, wherever it resumes
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # every rank, mid-step: after the all-reduce, before the optimizer
    opt.step()
    opt.zero_grad()
    ck.step(step)
ck.finish()
if rank == 0:
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, out)
dist.barrier()
dist.destroy_process_group()
""" % {"world": WORLD}


def world(ck_dir, kill_at, out, layout_off=False):
    """The world's ranks run to their end; their exit codes and stderr."""
    port = str(free_port())
    env = dict(ENV, OMP_NUM_THREADS="1", LAYOUT_OFF="1" if layout_off else "0")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), port, str(ck_dir), str(kill_at), str(out)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    return [p.returncode for p in procs], errs


def tensors(state, prefix=""):
    if isinstance(state, dict):
        return [kv for k in sorted(state, key=str) for kv in tensors(state[k], f"{prefix}.{k}")]
    if isinstance(state, (list, tuple)):
        return [kv for i, v in enumerate(state) for kv in tensors(v, f"{prefix}.{i}")]
    return [(prefix, state)] if isinstance(state, torch.Tensor) else []


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whole")
    codes, errs = world(tmp / "ck", -1, tmp / "whole.pt")
    assert codes == [0] * WORLD, "\n".join(e[-2000:] for e in errs)
    return tensors(torch.load(tmp / "whole.pt", weights_only=True))


@pytest.mark.parametrize("layout_off", [False, True], ids=["buckets-restored", "revert-check-initial-buckets"])
def test_a_ddp_world_with_ddps_defaults_resumes_bitwise(tmp_path, uninterrupted, layout_off):
    codes, errs = world(tmp_path / "ck", 5, tmp_path / "unused.pt", layout_off)
    assert codes == [-signal.SIGKILL] * WORLD, "\n".join(e[-2000:] for e in errs)
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-0000000002", "step-0000000004"]
    codes, errs = world(tmp_path / "ck", -1, tmp_path / "resumed.pt", layout_off)
    assert codes == [0] * WORLD, "\n".join(e[-2000:] for e in errs)
    assert all("resumed from step 4" in e for e in errs), errs
    got = tensors(torch.load(tmp_path / "resumed.pt", weights_only=True))
    assert [k for k, _ in got] == [k for k, _ in uninterrupted]
    assert len(got) == 6 + 6 * 2 + 6  # 6 parameters; AdamW's exp_avg, exp_avg_sq and step of each
    differ = [k for (k, a), (_, b) in zip(got, uninterrupted) if not torch.equal(a, b)]
    if layout_off:  # DDP's initial layout for the resumed world's first step: another summation order
        assert differ and all(k.startswith((".model.", ".optim.state.")) for k in differ), differ
        worst = max(float((a - b).abs().max()) for (k, a), (_, b) in zip(got, uninterrupted) if k in differ)
        assert 0 < worst < 1e-3, worst  # the last bits, not a different training
    else:
        assert differ == [], differ


def test_a_layout_that_cannot_be_restored_is_said_and_the_model_left_as_built():
    """A recorded layout of other parameters, a DDP with a comm hook (a new reducer would drop it): apply() says why
    and leaves the reducer as it was; a model that is no DDP, or no layout recorded: nothing to do."""
    code = """
import torch, torch.distributed as dist
from dflash_launch import ddp_buckets
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
ddp = torch.nn.parallel.DistributedDataParallel(m)
reducer = ddp.reducer
print(ddp_buckets.apply(ddp, [[0, 1, 2]]))
print(ddp_buckets.apply(ddp, [[3, 2, 1, 0]]) is None and ddp.reducer is not reducer)
hooked = torch.nn.parallel.DistributedDataParallel(m)
hooked.register_comm_hook(None, lambda state, bucket: dist.all_reduce(bucket.buffer(), async_op=True).get_future()
                          .then(lambda f: f.value()[0]))
print(ddp_buckets.apply(hooked, [[3, 2, 1, 0]]))
print(ddp_buckets.apply(m, [[3, 2, 1, 0]]), ddp_buckets.apply(ddp, None), ddp_buckets.layout(m))
dist.destroy_process_group()
""" % free_port()
    r = subprocess.run([sys.executable, "-c", code], env=dict(ENV, OMP_NUM_THREADS="1"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == [
        "the recorded buckets name other parameters than this model's 4", "True",
        "its DDP has a comm hook or mixed precision, which a rebuilt reducer would lose", "None None None"], r.stdout

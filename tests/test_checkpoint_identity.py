"""A checkpoint belongs to its run, and a restore that cannot be exact is refused by name (issue #55, items 2, 3, 5,
8, 11). Staged as a careless user would: a fixed [run] checkpoint_dir shared by two runs, the newest checkpoint
removed by hand or truncated, a quarantined frame before `--resume`, a model built in bf16 over an fp32 checkpoint.
Each refusal is CheckpointRefused: exit 78, never restarted, the message names the checkpoint, the frames and what to
do. The payloads: tests/payloads/ckpt_rank.py (a gloo world under dflash-launch), spool_rank.py (a world by hand)."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import ROOT
from test_spool import ENV

from dflash_launch.checkpoint_identity import frames_said  # noqa: E402 (test_spool puts it on the path)

EXIT_REFUSED = 78
PY_ENV = dict(ENV, PYTHONPATH=f"{ROOT / 'tests'}:{ENV['PYTHONPATH']}")

# One process on a spool of 8 frames (SpoolSource, outside a world): a checkpoint every 2 steps, synchronous.
# argv: ROOT CKPT_DIR MODE; MODE "fill" publishes the frames, "die:N" is SIGKILLed after step N, "run" runs to the end.
# Prints "STEP i frame" per step.
SPOOL_PROCESS = r"""
import os, signal, sys, torch
from dflash_launch import Checkpoint, use_exit_codes
from dflash_launch.spool import SpoolProducer, SpoolSource
from test_spool import CONTRACT
use_exit_codes()
root, ckdir, mode = sys.argv[1:4]
if mode == "fill":
    p = SpoolProducer(root, "target:0", CONTRACT, max_ready=1000)
    for seq in range(8):
        g = torch.Generator().manual_seed(seq)
        p.publish(torch.randn(1, 32, 96, generator=g), torch.randint(0, 63, (1, 32), generator=g))
    p.finish()
    sys.exit(0)
src = SpoolSource(root, "d:0", CONTRACT, producers=1, manifest_path=os.path.join(root, "..", "spool.json"))
torch.manual_seed(0)
m = torch.nn.Linear(96, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
ck = Checkpoint(m, opt, every_steps=2, dir=ckdir, source=src, async_save=False)
start = ck.restore()
for i, s in enumerate(src, start):
    m(s["hidden"]).sum().backward(); opt.step(); opt.zero_grad()
    s["ack"]()
    ck.step(i)
    print("STEP", i, s["frame"], flush=True)
    if mode == f"die:{i}":
        os.kill(os.getpid(), signal.SIGKILL)
ck.finish()
"""


def spool_process(tmp_path, mode, env=None):
    return subprocess.run([sys.executable, "-c", SPOOL_PROCESS, str(tmp_path / "spool"), str(tmp_path / "ck"), mode],
                          env=dict(PY_ENV, **(env or {})), capture_output=True, text=True, timeout=300)


def frame(seq):
    return f"target:0-{seq:010d}.safetensors"


def done_records(root):
    done = root / "done"
    return {f: json.loads(open(done / f).read() or "null") for f in os.listdir(done)}


def test_the_newest_checkpoint_removed_by_hand_is_refused_naming_its_frames(tmp_path):
    """Checkpoints at steps 2 and 4 committed frames 0-1 and 2-3; the process dies after step 4 (frame 4 pending).
    Someone removes step-4 "to resume from the one before". Before: the restore took step 2, done/ already had
    frames 2 and 3, and the source skipped them: 6 steps on 8 frames, exit 0, and the next step-4 took the old
    name. Now: refused (78) naming step-0000000004 (gone) and both frames, nothing trained, done/ untouched."""
    assert spool_process(tmp_path, "fill").returncode == 0
    first = spool_process(tmp_path, "die:4")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-0000000002", "step-0000000004"]
    import shutil
    shutil.rmtree(tmp_path / "ck" / "step-0000000004")
    before = done_records(tmp_path / "spool")
    assert sorted(before) == [frame(s) for s in range(4)], before
    second = spool_process(tmp_path, "run")
    assert second.returncode == EXIT_REFUSED, (second.returncode, second.stderr[-3000:])
    assert "STEP" not in second.stdout, second.stdout
    err = second.stderr
    assert "CheckpointRefused" in err and "EOFError" not in err, err[-3000:]
    assert (f"the spool's done/ records credit frames to checkpoints newer than what this restore can take (the "
            f"newest it can restore is {tmp_path}/ck/step-0000000002): step-0000000004 (gone) committed 2: "
            f"{frame(2)}, {frame(3)}") in err, err[-3000:]
    assert "never remove the newest checkpoint to resume from the one before" in err, err[-3000:]
    assert done_records(tmp_path / "spool") == before
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-0000000002"]


def truncate_distcp(ckpt):
    """Cuts every .distcp of checkpoint dir `ckpt` to 100 bytes (what a full disk or a bad copy leaves)."""
    cut = [f for f in os.listdir(ckpt) if f.endswith(".distcp")]
    assert cut, os.listdir(ckpt)
    for f in cut:
        os.truncate(os.path.join(ckpt, f), 100)


def test_a_truncated_newest_checkpoint_that_committed_frames_is_refused_by_name(tmp_path):
    """step-4 committed frames 2 and 3 and then lost its data (a truncated .distcp: dcp.load raised a bare
    EOFError, and a restart met it again). An older checkpoint would train those frames twice: refused (78) naming
    the checkpoint, the load's error and the frames, and what to do; the checkpoint stays where it is."""
    assert spool_process(tmp_path, "fill").returncode == 0
    assert spool_process(tmp_path, "die:4").returncode == -signal.SIGKILL
    truncate_distcp(tmp_path / "ck" / "step-0000000004")
    r = spool_process(tmp_path, "run")
    assert r.returncode == EXIT_REFUSED, (r.returncode, r.stderr[-3000:])
    assert "STEP" not in r.stdout
    path = tmp_path / "ck" / "step-0000000004"
    assert re.search(rf"CheckpointRefused: rank 0: checkpoint {path} cannot be loaded \(EOFError on rank 0\), and "
                     rf"the spool's done/ records credit 2 frames to it \({frame(2)}, {frame(3)}\): an older "
                     rf"checkpoint would train them again\. Fix: put back an intact copy of {path}", r.stderr), \
        r.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-0000000002", "step-0000000004"]


class Ended:
    """What subprocess.run would have said of plain_process's run: its exit code and what it said."""

    def __init__(self, returncode, stderr):
        self.returncode, self.stderr = returncode, stderr


def plain_process(ckdir, steps, *more, env=None):
    """One training process without a source, in this process (a torch import per case cost ~8 s each on the 2-core
    box; the launcher-run tests below take the real process path and its exit code): a Linear(4, 4) with AdamW, a
    checkpoint every 2 steps, steps from restore() to `steps`. `more` ("bf16",) builds the model in bf16. Returns
    (Ended, {"start", "w"}); a refusal is Ended(78, its words), as `use_exit_codes()` ends such a process."""
    import torch
    from dflash_launch import Checkpoint
    from dflash_launch.checkpoint import CheckpointRefused
    said = []
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    if more == ("bf16",):
        m = m.to(torch.bfloat16)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    c = Checkpoint(m, opt, every_steps=2, dir=str(ckdir), async_save=False, stop_signals=(), say=said.append,
                   env=dict(PY_ENV, **(env or {})))
    try:
        start = c.restore()
    except CheckpointRefused as refused:
        return Ended(refused.exit_code, "\n".join(said + [str(refused)])), None
    for i in range(start, int(steps)):
        torch.manual_seed(100 + i)
        m(torch.randn(2, 4, dtype=m.weight.dtype)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        c.step(i)
    return Ended(0, "\n".join(said)), {"start": start, "w": m.weight.float().flatten().tolist()}


def test_a_truncated_newest_checkpoint_that_committed_nothing_falls_back_to_the_one_before(tmp_path):
    """No source: no checkpoint commits frames, so a damaged newest one (step-6) is moved aside as
    damaged-step-0000000006 and step-4 restored; the 2 steps redone end with the weights of the run never damaged."""
    r, whole = plain_process(tmp_path / "whole", 6)
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = plain_process(tmp_path / "ck", 6)
    assert r.returncode == 0, r.stderr[-3000:]
    truncate_distcp(tmp_path / "ck" / "step-0000000006")
    r, out = plain_process(tmp_path / "ck", 6)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out["start"] == 4 and out["w"] == whole["w"], (out, whole)
    assert (f"checkpoint {tmp_path}/ck/step-0000000006 cannot be loaded (EOFError on rank 0)" in r.stderr and
            f"it committed no frames, so the one before it is exact: moved to "
            f"{tmp_path}/ck/damaged-step-0000000006" in r.stderr), r.stderr[-3000:]
    assert "damaged-step-0000000006" in os.listdir(tmp_path / "ck")


def test_an_fp32_checkpoint_is_not_restored_into_a_bf16_model(tmp_path):
    """Before: DCP copied the fp32 checkpoint into the bf16 model, converting every tensor silently. Now: refused
    (78), naming each tensor's dtype in the checkpoint and here; the same model in fp32 resumes."""
    r, _ = plain_process(tmp_path / "ck", 4)
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = plain_process(tmp_path / "ck", 6, "bf16")
    assert r.returncode == EXIT_REFUSED, (r.returncode, r.stderr[-3000:])
    assert (f"checkpoint {tmp_path}/ck/step-0000000004 holds tensors of another dtype or shape than this model and "
            f"optimizer (model.bias: float32 [4] in it, bfloat16 [4] here; model.weight: float32 [4, 4] in it, "
            f"bfloat16 [4, 4] here;") in r.stderr, r.stderr[-3000:]
    r, out = plain_process(tmp_path / "ck", 6)
    assert r.returncode == 0 and out["start"] == 4, r.stderr[-3000:]


def test_another_runs_or_an_unmarked_checkpoint_is_refused_unless_adopted(tmp_path):
    """Outside dflash-launch, by DFLASH_RUN_ID alone: run "a"'s checkpoint resumes in run "a", is refused in run "b"
    (78, naming both and the ways to go on), and is taken with DFLASH_CHECKPOINT_ADOPT=1. A checkpoint without an
    identity (written before checkpoints recorded one) is refused the same way unless adopted."""
    ck = tmp_path / "ck"
    r, _ = plain_process(ck, 2, env={"DFLASH_RUN_ID": "a"})
    assert r.returncode == 0, r.stderr[-3000:]
    identity = json.loads((ck / "step-0000000002" / "identity.json").read_text())
    assert (identity["run_id"], identity["world_size"], identity["model"]) == ("a", 1, {}), identity
    assert identity["tensors"]["model.weight"] == ["float32", [4, 4]], identity
    r, _ = plain_process(ck, 4, env={"DFLASH_RUN_ID": "b"})
    assert r.returncode == EXIT_REFUSED, r.stderr[-3000:]
    assert (f"checkpoint {ck}/step-0000000002 belongs to run a (role \"\"), not to this run b: a fresh run never "
            f"resumes another run's checkpoint. To continue that run: dflash-launch run --resume --run-id a; to "
            f"start from its state on purpose: DFLASH_CHECKPOINT_ADOPT=1 in the role's env") in r.stderr, r.stderr
    assert sorted(os.listdir(ck)) == ["step-0000000002"]  # nothing written by the refused run
    r, out = plain_process(ck, 4, env={"DFLASH_RUN_ID": "a"})
    assert r.returncode == 0 and out["start"] == 2, r.stderr[-3000:]
    r, out = plain_process(ck, 6, env={"DFLASH_RUN_ID": "b", "DFLASH_CHECKPOINT_ADOPT": "1"})
    assert r.returncode == 0 and out["start"] == 4, r.stderr[-3000:]
    assert f"adopting {ck}/step-0000000004 of run a" in r.stderr, r.stderr[-3000:]
    os.unlink(ck / "step-0000000006" / "identity.json")
    r, _ = plain_process(ck, 8, env={"DFLASH_RUN_ID": "b"})
    assert r.returncode == EXIT_REFUSED and "has no run identity" in r.stderr, r.stderr[-3000:]
    r, out = plain_process(ck, 8, env={"DFLASH_RUN_ID": "b", "DFLASH_CHECKPOINT_ADOPT": "1"})
    assert r.returncode == 0 and out["start"] == 6, r.stderr[-3000:]


def test_an_identity_that_cannot_be_read_is_damage_not_a_crash(tmp_path):
    """step-4's identity.json replaced by a JSON list, by values of the wrong kind, or by a link to /dev/zero: the
    checkpoint is damaged like one whose .distcp does not load (it committed no frames here): set aside, step 2
    restored. Never a TypeError, never a read without end."""
    import shutil
    r, _ = plain_process(tmp_path / "whole", 4)
    assert r.returncode == 0, r.stderr[-3000:]
    planted = {"list": "[1, 2]", "kinds": '{"run_id": 3, "role": "", "process": "", "world_size": "1", "model": {}, '
               '"spool": ""}', "link": None}
    for name, text in planted.items():
        ck = tmp_path / name
        shutil.copytree(tmp_path / "whole", ck, symlinks=True)
        identity = ck / "step-0000000004" / "identity.json"
        identity.unlink()
        if text is None:
            identity.symlink_to("/dev/zero")
        else:
            identity.write_text(text)
        r, out = plain_process(ck, 4)
        assert r.returncode == 0 and out["start"] == 2, (name, r.stderr[-3000:])
        assert f"checkpoint {ck}/step-0000000004 cannot be loaded (its identity.json " in r.stderr, r.stderr[-3000:]
        assert "damaged-step-0000000004" in os.listdir(ck)


def test_a_quarantined_frame_is_skipped_in_step_by_every_rank_on_resume(tmp_path):
    """A world of 3 with a checkpoint every 2 steps meets an unreadable frame 7 in its third round: every rank
    exits 65. Before: the resumed world died on "frame ... is next in the order but was rejected" every attempt.
    Now every rank's order leaves the quarantined frame out: the world resumes, every rank takes the same steps,
    each of the other 9 frames is trained once (committed once in done/), and the frame is named."""
    from test_spool_quarantine import stage_in_world
    from test_spool_world import WORLD, run_world
    env = {"CKPT_EVERY": "2"}
    codes, errs, _, root = run_world(tmp_path, "checkpoint", frames=10, fill=stage_in_world("truncated data", 7),
                                     extra_env=env)
    assert codes == [65] * WORLD, errs
    bad = frame(7)
    assert (root / "rejected" / bad).exists()
    committed = set(done_records(root))
    codes, errs, outs, _ = run_world(tmp_path, "checkpoint", frames=10, fill=lambda r, n: None, extra_env=env)
    assert codes == [0] * WORLD, "\n".join(e[-2000:] for e in errs)
    steps = [o["steps"] for o in outs]
    assert len(set(steps)) == 1, steps
    trained = [s["frame"] for o in outs for s in o["seen"] if not s["padded"]]
    assert sorted(trained) == sorted(set(frame(s) for s in range(10) if s != 7) - committed), (trained, committed)
    records = done_records(root)
    assert sorted(records) == [frame(s) for s in range(10) if s != 7], records
    assert all(r and r["checkpoint"].startswith(f"{tmp_path}/ckpt/step-") for r in records.values()), records
    for o, e in zip(outs, errs):
        assert o["stats"]["rejected_skipped"] == [bad], o["stats"]
        assert f"the fixed order skips the 1 quarantined frame(s) in rejected/ ({bad};" in e, e[-2000:]


# --- under dflash-launch: a DDP world of 2 gloo ranks (tests/payloads/ckpt_rank.py) --------------------------------

def drafters(r):
    return [p for p in r.summary()["processes"] if p["role"] == "drafter"]


def assert_refused_once(r, text):
    """Run `r` ended 78: each drafter refused with `text` in its stderr, in its one attempt (never restarted)."""
    assert r.wait(timeout=300) == EXIT_REFUSED, r.out[-3000:] + r.err[-2000:]
    for p in drafters(r):
        assert p["restarts"] == 0 and len(p["attempts"]) == 1, (p["name"], p["restarts"], p["attempts"])
        err = (r.run_dir.parent.parent / p["log"]["stderr"]).read_text()
        assert err.count("checkpoint.CheckpointRefused: ") == 1 and text in err, err[-3000:]
        assert "resumed from step" not in err and "EOFError\n" not in err, err[-3000:]


def test_two_runs_on_one_checkpoint_dir(launch, tmp_path):
    """A fixed [run] checkpoint_dir, as docs/config.md's example has it. Run "a" is stopped (SIGTERM: the stop's
    checkpoint commits its frames). Then, on the same directory:
    - a fresh run "b" (no --resume): before, it restored a's weights, optimizer and round and trained 0 of its own
      spool's frames, exit 0. Now every rank refuses (78, no restart), naming a's checkpoint, its run and the ways
      on, and trains nothing;
    - `run --resume` of "a" with a's newest checkpoint truncated: refused once, naming the checkpoint and the
      frames it committed (an older one would train them twice);
    - the intact copy put back, as the message says: "a" resumes from its stop and ends with every frame once;
    - a fresh run "c" with DFLASH_CHECKPOINT_ADOPT=1: adopts a's last checkpoint (its step, weights, optimizer) and
      trains all of its own spool's frames once, from their start."""
    import shutil
    from supervise import wait_until
    from test_checkpoint import RANKS, assert_committed_exactly_once, config, logs
    frames, ck = 16, tmp_path / "ckpt" / "drafter"
    extra = f'checkpoint_dir = "{tmp_path}/ckpt"'
    env = ', CKPT_SLEEP_MS = "300", CKPT_EVERY = "1000"'
    cfg = config(tmp_path, extra=extra, drafter_env=env, producers=1, frames=frames)
    a = launch(cfg, env=ENV, run_id="a")
    pending = tmp_path / "spool" / "a" / "pending"
    assert wait_until(lambda: len(list(pending.glob("*/*"))) >= 2 * RANKS, timeout=120), a.out[-3000:]
    os.kill(a.pid, signal.SIGTERM)
    assert a.wait(timeout=120) == 128 + signal.SIGTERM, a.out[-3000:]
    stops = set(re.findall(r"drafter:\d: SIGTERM: checkpoint at step (\d+) committed", logs(a)))
    assert len(stops) == 1, logs(a)[-3000:]
    stopped_at = int(stops.pop())
    newest = ck / f"step-{stopped_at:010d}"
    assert sorted(os.listdir(ck)) == [newest.name], os.listdir(ck)
    assert json.loads((newest / "identity.json").read_text())["run_id"] == "a"
    committed = [f for f, rec in done_records(tmp_path / "spool" / "a").items()
                 if rec and rec["checkpoint"] == str(newest)]
    assert len(committed) >= 2, committed
    earlier = set(a.run_dir.rglob("*.log"))

    b = launch(cfg, env=ENV, run_id="b")
    assert_refused_once(b, f"checkpoint {newest} belongs to run a (role drafter), not to this run b: a fresh run "
                           f"never resumes another run's checkpoint. To continue that run: dflash-launch run --resume "
                           f"--run-id a; to start from its state on purpose: DFLASH_CHECKPOINT_ADOPT=1 in the role's "
                           f"env; or give this run another [run] checkpoint_dir")
    assert sorted(os.listdir(ck)) == [newest.name] and not (tmp_path / "final.pt").exists()
    assert not list((tmp_path / "spool" / "b" / "pending").glob("*/*"))  # nothing trained on b's frames

    shutil.copytree(newest, tmp_path / "intact")
    truncate_distcp(newest)
    a2 = launch(cfg, env=ENV, run_id="a", args=["--resume"])
    assert_refused_once(a2, f"checkpoint {newest} cannot be loaded (")
    assert f"and the spool's done/ records credit {len(committed)} frames to it ({frames_said(committed)})" in \
        logs(a2, earlier), logs(a2, earlier)[-3000:]
    earlier = set(a2.run_dir.rglob("*.log"))

    shutil.rmtree(newest)
    shutil.copytree(tmp_path / "intact", newest)
    a3 = launch(cfg, env=ENV, run_id="a", args=["--resume"])
    assert a3.wait(timeout=400) == 0, a3.out[-4000:] + a3.err[-2000:]
    assert set(re.findall(r"drafter:\d: resumed from step (\d+)", logs(a3, earlier))) == {str(stopped_at)}
    assert_committed_exactly_once(a3, producers=1, frames=frames)
    last = ck / f"step-{frames // RANKS:010d}"
    assert last.is_dir(), os.listdir(ck)

    cfg.write_text(cfg.read_text().replace('CKPT_EVERY = "1000"', 'CKPT_EVERY = "1000", DFLASH_CHECKPOINT_ADOPT = "1"'))
    c = launch(cfg, env=ENV, run_id="c")
    assert c.wait(timeout=400) == 0, c.out[-4000:] + c.err[-2000:]
    text = logs(c, set(a3.run_dir.rglob("*.log")))
    adopted = re.findall(r"(drafter:\d): " + re.escape(f"adopting {last} of run a (role drafter, "
                                                       f"DFLASH_CHECKPOINT_ADOPT=1): its weights, optimizer and step; "
                                                       f"this spool's frames from its start"), text)
    assert set(adopted) == {f"drafter:{i}" for i in range(RANKS)}, text[-3000:]
    assert set(re.findall(r"drafter:\d: resumed from step (\d+)", text)) == {str(frames // RANKS)}, text[-3000:]
    m = assert_committed_exactly_once(c, producers=1, frames=frames)
    assert set(m["committed_by_checkpoint"]) == {str(ck / f"step-{2 * frames // RANKS:010d}")}, m
    for p in drafters(c):
        assert p["metrics"]["steps"] == frames // RANKS, p["metrics"]


def test_a_damaged_checkpoint_whose_frames_were_not_yet_committed_is_skipped_by_the_world(launch, tmp_path):
    """Rank 0 renames step-6 into place and dies before its frames move to done/, and step-6's data is lost (its
    .distcp files truncated). Before: every restart's dcp.load raised EOFError until the budget was gone. Now the
    restarted world finds that nothing in done/ names step-6: it moves it aside (damaged-step-0000000006), resumes
    from step 3 on every rank, replays the frames step 6 covered, and ends with each frame committed once."""
    from test_checkpoint import RANKS, assert_committed_exactly_once, config, logs
    r = launch(config(tmp_path, kill="0:commit:6", drafter_env=', CKPT_DAMAGE = "1"'), env=ENV)
    assert r.wait(timeout=400) == 0, r.out[-4000:] + r.err[-2000:]
    text = logs(r)
    ck = r.run_dir / "checkpoints" / "drafter"
    assert set(re.findall(r"drafter:\d: resumed from step (\d+)", text)) == {"3"}, text[-3000:]
    skipped = re.findall(rf"(drafter:\d): checkpoint {re.escape(str(ck))}/step-0000000006 cannot be loaded \(", text)
    assert set(skipped) == {f"drafter:{i}" for i in range(RANKS)}, text[-3000:]
    assert f"it committed no frames, so the one before it is exact: moved to {ck}/damaged-step-0000000006" in text
    assert [p["restarts"] for p in drafters(r)] == [1] * RANKS
    m = assert_committed_exactly_once(r)
    # Kept aside for whoever looks; the step-6 the resumed world wrote again is whole and committed its own frames.
    assert "damaged-step-0000000006" in os.listdir(ck)
    assert set(m["committed_by_checkpoint"]) == {str(ck / f"step-{s:010d}") for s in (3, 6, 9, 10)}, m

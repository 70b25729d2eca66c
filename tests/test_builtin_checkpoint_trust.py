"""A builtin drafter's checkpoint is restored only when that is exact (issue #55, items 2, 3 and 5), under
dflash-launch with real processes and signals:

- two runs with one [run] checkpoint_dir: the fresh one refuses the other run's checkpoint (exit 78, once, nothing
  trained, the checkpoints untouched); `run --resume` of the first resumes it; DFLASH_CHECKPOINT_ADOPT=1 starts a
  fresh run from its weights on purpose (its first loss is those weights' loss);
- the newest checkpoint removed (what the drafter's message used to advise): the frames it committed are in done/,
  so the restart refuses, naming it and its frames, instead of skipping them and reusing its name;
- the newest checkpoint truncated: with frames in done/ naming it, exit 78 once (never restarted); one that
  committed nothing is set aside and the one before restored, every frame then committed exactly once."""
import json
import os
import re
import shutil
import signal
import time

import pytest
from safetensors import safe_open

from conftest import run
from supervise import wait_until
from test_spool import BUILTIN, ENV, SMALL_ENV, by_name, needs_builtin, payload_of
from test_spool import config as spool_config

pytestmark = needs_builtin

FRAMES, EVERY = 12, 2


def config(tmp_path, ck, drafter_env="", pace_ms=250):
    """One target, one checkpointing drafter (a step of `pace_ms`), checkpoints in the fixed dir `ck`."""
    restart = 'restart = { policy = "on-failure", max = 2, window = "1h", backoff = "200ms..200ms" }'
    return spool_config(tmp_path, f"""
[[role]]
name = "target"
cpu = 1
builtin = "target"
env = {{ DFLASH_SAMPLES = "{FRAMES}", DFLASH_SPOOL_MAX = "{FRAMES}" }}
world = "none"

[[role]]
name = "drafter"
cpu = 1
builtin = "drafter"
env = {{ DFLASH_CHECKPOINT_EVERY = "{EVERY}", DFLASH_PACE_MS = "{pace_ms}"{drafter_env} }}
world = "none"
{restart}
""", run_extra=f'checkpoint_dir = "{ck}"')


def text_of(r):
    return r.out + r.err + "".join(p.read_text(errors="replace") for p in r.run_dir.rglob("*.log"))


def records(spool):
    """done/'s commit records: frame -> the checkpoint that committed it."""
    out = {}
    for f in os.listdir(spool / "done") if (spool / "done").is_dir() else []:
        t = (spool / "done" / f).read_text()
        if t:
            out[f] = json.loads(t)["checkpoint"]
    return out


def committed_checkpoints(ck):
    return sorted(n for n in os.listdir(ck) if re.fullmatch(r"step-\d{10}", n) and (ck / n / "drafter.safetensors").exists())


def snapshot(ck):
    return {n: (ck / n / "drafter.safetensors").read_bytes() for n in committed_checkpoints(ck)}


def stop_with_a_committed_newest(r, ck, spool, named=4):
    """SIGSTOPs the drafter at a moment when `named` frames are in done/ and its newest committed checkpoint is one
    that done/ names (not one renamed whose frames are not moved yet); its pid."""
    pid = []

    def stopped_right():
        if not pid:
            log = r.run_dir / "supervisor.log"
            p = log.exists() and "drafter:0 STARTING (pid" in log.read_text() and payload_of(r, "drafter:0")
            if not p:
                return False
            pid.append(p)
        os.kill(pid[0], signal.SIGSTOP)
        time.sleep(0.05)
        rec = records(spool)
        names = committed_checkpoints(ck) if ck.is_dir() else []
        if len(rec) >= named and names and str(ck / names[-1]) in rec.values():
            return True
        os.kill(pid[0], signal.SIGCONT)
        time.sleep(0.05)
        return False

    assert wait_until(stopped_right, timeout=120, step=0.05), text_of(r)[-3000:]
    return pid[0]


def drafter_of(r):
    return by_name(r.summary())["drafter:0"]


def assert_refused_once(r, p):
    """The drafter's last attempt exited 78 and was not restarted (the budget allowed 2 restarts)."""
    assert p["exit_code"] == 78 and p["attempts"][-1]["exit_code"] == 78, p
    assert not p["attempts"][-1]["restarted"], p["attempts"]


def test_a_fresh_run_refuses_another_runs_checkpoint_resume_and_adopt_take_it(launch, tmp_path):
    ck_root = tmp_path / "ck"
    ck = ck_root / "drafter" / "drafter:0"
    cfg = config(tmp_path, ck_root)
    # Run a, stopped by SIGTERM mid-way: its drafter checkpoints and ends by the signal; the spool stays.
    a = launch(cfg, env=ENV, run_id="a")
    assert wait_until(lambda: len(records(tmp_path / "spool" / "a")) >= 4, timeout=120), text_of(a)[-3000:]
    os.kill(a.pid, signal.SIGTERM)
    assert a.wait(timeout=120) != 0
    stopped = set(re.findall(r"drafter:0: SIGTERM: checkpoint at step (\d+) committed", text_of(a)))
    assert len(stopped) == 1, text_of(a)[-3000:]
    stopped_at = int(stopped.pop())
    assert 4 <= stopped_at < FRAMES, stopped_at
    before = snapshot(ck)
    assert f"step-{stopped_at:010d}" in before

    # Run b, fresh, the same config: refused once, by name, with the ways to resume on purpose; nothing trained.
    b = launch(cfg, env=ENV, run_id="b")
    assert b.wait(timeout=120) != 0, text_of(b)[-3000:]
    p = drafter_of(b)
    assert_refused_once(b, p)
    assert len(p["attempts"]) == 1 and p["restarts"] == 0, p
    newest = ck / f"step-{stopped_at:010d}"
    said = text_of(b)
    assert f"checkpoint {newest} belongs to run a (role drafter), not to this run b" in said, said[-3000:]
    assert "dflash-launch run --resume --run-id a" in said and "DFLASH_CHECKPOINT_ADOPT=1" in said, said[-3000:]
    assert not (p["metrics"] or {}).get("losses"), p["metrics"]
    spool_b = tmp_path / "spool" / "b"
    for d in (spool_b / "done", spool_b / "pending" / "drafter:0"):
        assert not d.is_dir() or not os.listdir(d), (d, os.listdir(d))
    assert snapshot(ck) == before  # nothing written, nothing pruned

    # Run a resumed: from the step it stopped at, on its own spool's remaining frames, each committed once.
    a2 = launch(cfg, env=ENV, run_id="a", args=["--resume"])
    assert a2.wait(timeout=300) == 0, text_of(a2)[-4000:]
    assert f"drafter:0: resumed from step {stopped_at} " in text_of(a2)
    m = drafter_of(a2)["metrics"]
    assert m["resumed_from_step"] == stopped_at and m["steps"] == FRAMES - stopped_at, m
    s = json.loads((a2.run_dir / "spool.json").read_text())
    assert s["final"] and s["exactly_once"] and s["frames_consumed"] == FRAMES and s["pending"] == 0, s
    assert sum(s["committed_by_checkpoint"].values()) == FRAMES, s
    final_a = ck / f"step-{FRAMES:010d}" / "drafter.safetensors"
    weights_a = tmp_path / "a-final.safetensors"  # run c's checkpoints will prune it (keep = 3)
    shutil.copyfile(final_a, weights_a)

    # Run c, fresh, opted in: it starts from run a's last weights, on its own spool's frames from the first.
    c_dir = tmp_path / "c"
    c_dir.mkdir()
    c = launch(config(c_dir, ck_root, ', DFLASH_CHECKPOINT_ADOPT = "1"'), env=ENV, run_id="c")
    assert c.wait(timeout=300) == 0, text_of(c)[-4000:]
    said = text_of(c)
    assert f"drafter:0: adopting {final_a.parent} of run a (role drafter, DFLASH_CHECKPOINT_ADOPT=1)" in said, said[-3000:]
    m = drafter_of(c)["metrics"]
    assert m["resumed_from_step"] == FRAMES and m["steps"] == FRAMES and len(m["losses"]) == FRAMES, m
    # Its first step's loss is run a's final weights' loss on frame 0 (the tap a target publishes first).
    env = dict(ENV, **SMALL_ENV)
    frame = tmp_path / "frame0.safetensors"
    assert run([BUILTIN, "tap", "--rank", "0", "--seq", "0", "--out", frame], env=env).returncode == 0
    got = run([BUILTIN, "loss", "--weights", weights_a, "--frame", frame], env=env)
    assert got.returncode == 0, got.stderr
    adopted_loss = json.loads(got.stdout)["loss"]
    assert m["losses"][0] == pytest.approx(adopted_loss, abs=2e-5), (m["losses"][:3], got.stdout)
    first_a = drafter_of(a)["metrics"]["losses"][0]  # the seeded initial weights' loss on the same frame
    assert abs(m["losses"][0] - first_a) > 1e-3, (m["losses"][0], first_a)
    # Its checkpoints are run c's, and commit run c's frames.
    with safe_open(str(ck / f"step-{2 * FRAMES:010d}" / "drafter.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["run_id"] == "c" and meta["spool"] == str(tmp_path / "c" / "spool" / "c"), meta
    assert json.loads((c.run_dir / "spool.json").read_text())["exactly_once"]


def test_removing_the_newest_checkpoint_is_refused_by_name_not_resumed_past_its_frames(launch, tmp_path):
    ck = tmp_path / "ck" / "drafter" / "drafter:0"
    spool = tmp_path / "spool" / "r"
    r = launch(config(tmp_path, tmp_path / "ck"), env=ENV)
    pid = stop_with_a_committed_newest(r, ck, spool)
    rec = records(spool)
    newest = max(rec.values())
    removed_frames = sorted(f for f, c in rec.items() if c == newest)
    before = committed_checkpoints(ck)
    assert len(before) >= 2 and str(ck / before[-1]) == newest, (before, newest)
    shutil.rmtree(newest)  # "remove it to resume from the one before"
    os.kill(pid, signal.SIGKILL)
    assert r.wait(timeout=120) != 0, text_of(r)[-3000:]
    p = drafter_of(r)
    assert_refused_once(r, p)
    assert len(p["attempts"]) == 2 and p["restarts"] == 1, p  # the kill's restart, then the refusal
    said = text_of(r)
    listed = ", ".join(removed_frames)
    assert f"done/ holds frames committed by {newest} (gone): {len(removed_frames)} frames {listed}" in said, said[-3000:]
    assert "Never remove the newest checkpoint to resume from the one before" in said
    assert "remove it to resume from the one before" not in said
    # Nothing resumed past them: no checkpoint took the removed one's name, done/ still credits it, no step ran.
    assert committed_checkpoints(ck) == before[:-1]
    assert records(spool) == rec


@pytest.mark.parametrize("committed", [True, False], ids=["committed-frames", "committed-nothing"])
def test_a_truncated_newest_checkpoint(launch, tmp_path, committed):
    """With frames in done/ naming it: exit 78 once, named, left in place. One that committed nothing (renamed, then
    killed before its frames moved, then damaged): set aside, the one before restored, the run ends with every
    frame committed exactly once by the first checkpoint after it."""
    ck = tmp_path / "ck" / "drafter" / "drafter:0"
    spool = tmp_path / "spool" / "r"
    r = launch(config(tmp_path, tmp_path / "ck"), env=ENV)
    pid = stop_with_a_committed_newest(r, ck, spool)
    names = committed_checkpoints(ck)
    newest = ck / names[-1]
    step = int(names[-1][5:])
    data = (newest / "drafter.safetensors").read_bytes()
    if committed:
        damaged = newest
        (damaged / "drafter.safetensors").write_bytes(data[: len(data) // 2])
    else:
        damaged = ck / f"step-{step + EVERY:010d}"
        damaged.mkdir(mode=0o700)
        (damaged / "drafter.safetensors").write_bytes(data[: len(data) // 2])
    rec = records(spool)
    os.kill(pid, signal.SIGKILL)
    rc = r.wait(timeout=300)
    p = drafter_of(r)
    said = text_of(r)
    if committed:
        assert rc != 0, said[-3000:]
        assert_refused_once(r, p)
        assert len(p["attempts"]) == 2 and p["restarts"] == 1, p
        frames = sorted(f for f, c in rec.items() if c == str(damaged))
        assert f"checkpoint {damaged} is damaged (" in said and f"committed {len(frames)} frames {frames[0]}" in said, said[-3000:]
        assert f"put back a good copy of {damaged}" in said
        assert (damaged / "drafter.safetensors").stat().st_size == len(data) // 2  # left where it is
        assert records(spool) == rec
    else:
        assert rc == 0, said[-4000:]
        assert f"checkpoint {damaged} is damaged (" in said and f"set aside as {ck}/damaged-{damaged.name}" in said, said[-3000:]
        assert f"drafter:0: resumed from step {step} " in said, said[-3000:]
        assert (ck / f"damaged-{damaged.name}" / "drafter.safetensors").stat().st_size == len(data) // 2
        assert len(p["attempts"]) == 2 and p["exit_code"] == 0 and p["metrics"]["steps"] == FRAMES - step, p
        s = json.loads((r.run_dir / "spool.json").read_text())
        assert s["final"] and s["exactly_once"] and s["frames_consumed"] == FRAMES and s["pending"] == 0, s
        runs = s["producers"]["target:0"]["committed_by"]
        assert sum(last - first + 1 for first, last, _ in runs) == FRAMES, runs
        for first, last, c in runs:  # frame k by the first checkpoint after it: none skipped, none twice
            at = int(c.rsplit("step-", 1)[1])
            assert at - EVERY <= first and last < at, runs

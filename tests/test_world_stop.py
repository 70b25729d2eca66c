"""One rank's stop is its world's stop (issue #55 item 6). A DDP world of 3 gloo ranks trains on the spool with
dflash_launch.Checkpoint under dflash-launch; mid-run a person stops ONE rank by hand, `ctl signal SIGTERM drafter:1`
or `ctl stop drafter:1`. The world agrees on the stop at its next step, writes and commits one checkpoint, and every
rank ends by SIGTERM, the two that got no signal too (they raised "ValueError: None is not a valid Signals" and
exited 1 before, which scope "role" charged as a restart, and then rank 0 waited forever for the rank held by hand).
The supervisor holds the whole world as stopped by ctl: no restart, no failure, no culprit; `ctl stop all` ends the
run with exit 0, and `run --resume` continues from the stop's checkpoint to the end with every frame trained once;
or `ctl start drafter:1` starts the world again together and it resumes from that checkpoint in the same run.
The payloads: tests/payloads/ckpt_rank.py, ckpt_producer.py (as tests/test_checkpoint.py stages them)."""
import json
import os
import re

import pytest

from conftest import run
from supervise import wait_until
from test_checkpoint import assert_committed_exactly_once, config, logs
from test_spool import ENV

RANKS, FRAMES = 3, 36  # one producer: 12 rounds of 3, a pause each, so the stop lands with steps left
DRAFTERS = [f"drafter:{k}" for k in range(RANKS)]


def ctl(bin_dir, env, *args):
    return run([bin_dir / "dflash-launch", "ctl", "stopped", *args], env=env, timeout=60)


def states(bin_dir, env):
    r = ctl(bin_dir, env, "status", "--json")
    if r.returncode != 0:
        return {}
    return {p["name"]: p for p in json.loads(r.stdout)["processes"]}


def stop_one_rank(launch, bin_dir, tmp_path, verb):
    """The run, stopped mid-run by `verb` to drafter:1: every rank of its world ended and is held by hand, the run
    still up. Returns (the run, its ctl environment, its config, the step the stop's checkpoint holds)."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(ENV, XDG_RUNTIME_DIR=str(xdg))
    cfg = config(tmp_path, extra=f'checkpoint_dir = "{tmp_path}/ckpt"', ranks=RANKS, producers=1, frames=FRAMES,
                 drafter_env=', CKPT_SLEEP_MS = "300", CKPT_EVERY = "1000"')
    pending = tmp_path / "spool" / "stopped" / "pending"
    r = launch(cfg, env=env, run_id="stopped")
    # 2 steps done on every rank: the stop's checkpoint holds something
    assert wait_until(lambda: len(list(pending.glob("*/*"))) >= 2 * RANKS, timeout=180), r.out[-3000:]
    sent = ctl(bin_dir, env, *verb)
    assert sent.returncode == 0, sent.stderr

    def world_ended():
        s = states(bin_dir, env)
        return r.proc.poll() is not None or (
            len(s) > RANKS and all(s[n]["state"] not in ("STARTING", "RUNNING", "STOPPING") for n in DRAFTERS))
    assert wait_until(world_ended, timeout=120), states(bin_dir, env)
    s = states(bin_dir, env)
    assert r.proc.poll() is None, "the run went on without its world: " + r.err[-2000:]
    for n in DRAFTERS:  # held by hand, not waiting to restart (rank 0 would wait for rank 1 forever)
        assert (s[n]["state"], s[n]["held"], s[n]["restarts"]) == ("EXITED", True, 0), s[n]
    assert s["target:0"]["state"] in ("RUNNING", "EXITED"), s["target:0"]  # the producer is not the world
    text = logs(r)
    assert "Traceback" not in text and "ValueError" not in text, text[-4000:]
    committed = set(re.findall(r"(drafter:\d): SIGTERM: checkpoint at step (\d+) committed", text))
    assert {n for n, _ in committed} == set(DRAFTERS) and len({st for _, st in committed}) == 1, text[-3000:]
    stopped_at = int(committed.pop()[1])
    assert 2 <= stopped_at < FRAMES // RANKS, stopped_at
    assert os.path.isdir(tmp_path / "ckpt" / "drafter" / f"step-{stopped_at:010d}")
    return r, env, cfg, stopped_at


def assert_trained_once_from(tmp_path, stopped_at):
    """The world that resumed trained the frames after the stop's checkpoint, each once, none it had trained before."""
    seen = [json.loads((tmp_path / f"final.pt.{k}.json").read_text()) for k in range(RANKS)]
    assert all(x["start"] == stopped_at for x in seen), [x["start"] for x in seen]
    frames = [f for x in seen for _, f, _ in x["seen"]]
    assert len(frames) == len(set(frames)) == FRAMES - RANKS * stopped_at, frames


@pytest.mark.parametrize("verb", [["signal", "SIGTERM", "drafter:1"], ["stop", "drafter:1"]],
                         ids=["ctl-signal-SIGTERM", "ctl-stop"])
def test_one_ranks_stop_by_hand_stops_its_world_with_a_checkpoint_and_no_restart(launch, bin_dir, tmp_path, verb):
    r, env, cfg, stopped_at = stop_one_rank(launch, bin_dir, tmp_path, verb)
    assert ctl(bin_dir, env, "stop", "all").returncode == 0
    assert r.wait(timeout=120) == 0, r.out[-3000:] + r.err[-2000:]
    summary = r.summary()
    assert summary["restarts"] == [] and summary["culprit"] is None, (summary["restarts"], summary["culprit"])
    by_name = {p["name"]: p for p in summary["processes"]}
    for n in DRAFTERS:  # every rank ended by the same signal, as the rank that got it did
        last = by_name[n]["attempts"][-1]
        assert (len(by_name[n]["attempts"]), last["signal"], last["exit_code"], last["outcome"]) == \
            (1, "SIGTERM", 143, "stopped by ctl"), last

    earlier = set(r.run_dir.rglob("*.log"))
    r2 = launch(cfg, env=env, run_id="stopped", args=["--resume"])
    assert r2.wait(timeout=400) == 0, r2.out[-4000:] + r2.err[-2000:]
    text2 = logs(r2, earlier)
    resumed = set(re.findall(r"(drafter:\d): resumed from step (\d+)", text2))
    assert resumed == {(n, str(stopped_at)) for n in DRAFTERS}, text2[-3000:]
    assert "Traceback" not in text2, text2[-3000:]
    assert_committed_exactly_once(r2, producers=1, frames=FRAMES)
    assert_trained_once_from(tmp_path, stopped_at)


def test_ctl_start_of_one_rank_resumes_its_world_from_the_stops_checkpoint(launch, bin_dir, tmp_path):
    """`ctl stop drafter:1`, then `ctl start drafter:1`: the world starts again together (a lone rank would wait for
    its held peers) and resumes, in the same run, from the checkpoint the stop committed; the run ends 0."""
    r, env, _, stopped_at = stop_one_rank(launch, bin_dir, tmp_path, ["stop", "drafter:1"])
    earlier = set(r.run_dir.rglob("*.log"))
    started = ctl(bin_dir, env, "start", "drafter:1")
    assert started.returncode == 0 and all(n in started.stdout for n in DRAFTERS), started.stdout + started.stderr
    assert r.wait(timeout=400) == 0, r.out[-4000:] + r.err[-2000:]
    text = logs(r, earlier)
    resumed = set(re.findall(r"(drafter:\d): resumed from step (\d+)", text))
    assert resumed == {(n, str(stopped_at)) for n in DRAFTERS}, text[-3000:]
    summary = r.summary()
    assert summary["restarts"] == [] and summary["culprit"] is None, (summary["restarts"], summary["culprit"])
    assert_committed_exactly_once(r, producers=1, frames=FRAMES)
    assert_trained_once_from(tmp_path, stopped_at)

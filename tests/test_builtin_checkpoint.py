"""The builtin C++ drafter resumes, not restarts (issue #45, item 5): under dflash-launch with a restart policy, one
builtin target and one builtin drafter checkpointing every 4 steps. The drafter SIGKILLed mid-write of a checkpoint
(it resumes from the previous one, the half-written one removed) and again mid-step (it resumes from the last one):
the run exits 0, every frame is committed to done/ exactly once, each naming the checkpoint that committed it, and
the final parameters and AdamW state are bitwise those of the run never killed (one producer: a fixed frame order).
Without checkpoints the drafter acknowledges straight to done/, as before (tests/test_spool.py)."""
import json
import os
import re
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import run

from supervise import wait_until
from test_spool import BUILTIN, ENV, SMALL_ENV, by_name, needs_builtin, payload_of
from test_spool import config as spool_config

pytestmark = needs_builtin

FRAMES, EVERY = 24, 4


def config(tmp_path, drafter_env="", every=EVERY):
    restart = 'restart = { policy = "on-failure", max = 2, window = "1h", backoff = "200ms..200ms" }'
    checkpointing = f'DFLASH_CHECKPOINT_EVERY = "{every}"' if every else 'DFLASH_PACE_MS = "0"'
    return spool_config(tmp_path, f"""
[[role]]
name = "target"
cpu = 1
builtin = "target"
env = {{ DFLASH_SAMPLES = "{FRAMES}", DFLASH_SPOOL_MAX = "8" }}
world = "none"

[[role]]
name = "drafter"
cpu = 1
builtin = "drafter"
env = {{ {checkpointing}{drafter_env} }}
world = "none"
{restart}
""")


def checkpoints(r):
    return r.run_dir / "checkpoints" / "drafter" / "drafter:0"


def final_state(r):
    """Every parameter and the AdamW state of the last checkpoint (the one written at the end)."""
    d = checkpoints(r) / f"step-{FRAMES:010d}"
    return load_file(str(d / "drafter.safetensors"))


def assert_committed_exactly_once(r, every=EVERY):
    m = json.loads((r.run_dir / "spool.json").read_text())
    assert m["final"] and m["exactly_once"] and m["frames_consumed"] == FRAMES and m["pending"] == 0, m
    assert sum(m["committed_by_checkpoint"].values()) == FRAMES, m["committed_by_checkpoint"]
    runs = m["producers"]["target:0"]["committed_by"]
    assert all(ck and "/checkpoints/drafter/drafter:0/step-" in ck for _, _, ck in runs), runs
    assert sum(last - first + 1 for first, last, _ in runs) == FRAMES, runs
    # Each checkpoint committed the frames of its own steps, in order: frame k by the first checkpoint after it.
    for first, last, ck in runs:
        step = int(ck.rsplit("step-", 1)[1])
        assert step - every <= first and last < step, runs
    return m


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bin_dir):
    from supervise import run_to_the_end
    tmp = tmp_path_factory.mktemp("uninterrupted")
    r = run_to_the_end(bin_dir, config(tmp), ENV, timeout=300)
    assert_committed_exactly_once(r)
    assert "no checkpoint in" in r.out + "".join(p.read_text() for p in r.run_dir.rglob("*.log"))
    return final_state(r)


def test_the_drafter_reads_through_the_ring_and_trains_on_the_same_values_with_and_without_checkpoints(bin_dir,
                                                                                                    tmp_path):
    """The drafter hands each acknowledged (or, checkpointing, committed) frame's file back to the target, which
    writes later frames over it, and reads them through the mappings it kept (the spool's ring, docs/builtin.md;
    frames of ~300 KB, over its 256 KiB minimum). Against the same run with DFLASH_SPOOL_RING=0 (a new file and a
    new mapping per frame, as before the ring), each of the 24 losses is the same (to the 5 decimals the metrics
    keep; a wrong frame moves the first): no step read an earlier frame's bytes or its own copy-on-write pages;
    and checkpointing, every frame is committed once."""
    from supervise import run_to_the_end
    got = {}
    for every, ring in ((0, True), (0, False), (EVERY, True)):
        d = tmp_path / f"every{every}-ring{int(ring)}"
        d.mkdir()
        cfg = config(d, "" if ring else ', DFLASH_SPOOL_RING = "0"', every=every)
        cfg.write_text(cfg.read_text().replace("hidden = 32\n", "hidden = 800\n"))
        r = run_to_the_end(bin_dir, cfg, ENV, timeout=300)
        got[every, ring] = by_name(r.summary())["drafter:0"]["metrics"]
        if every:
            assert_committed_exactly_once(r)
        else:
            m = json.loads((r.run_dir / "spool.json").read_text())
            assert m["final"] and m["exactly_once"] and m["frames_consumed"] == FRAMES, m
    plain = got[0, False]
    assert plain["mappings_reused"] == 0, plain
    for key in ((0, True), (EVERY, True)):
        assert got[key]["mappings_reused"] > 0, (key, got[key])
        assert len(got[key]["losses"]) == FRAMES and got[key]["losses"] == plain["losses"], (key, got[key], plain)


def test_killed_mid_write_and_mid_step_it_resumes_and_ends_bitwise_equal(launch, tmp_path, uninterrupted):
    # A pause between each checkpoint's write and its commit (a window to kill it in) and a slow step: wide enough
    # for a test process slowed by a loaded machine (-n 3 on 2 cores) to land both kills where they must.
    r = launch(config(tmp_path, ', DFLASH_CHECKPOINT_PAUSE_MS = "1000", DFLASH_PACE_MS = "120"'), env=ENV)
    ck = tmp_path / "runs" / "r" / "checkpoints" / "drafter" / "drafter:0"
    # 1. SIGKILL while step 8's (or, on a loaded machine, 12's) checkpoint is written but not committed: the one
    # before must be what it resumes from.
    writing = []
    assert wait_until(lambda: writing.extend(n for n in ("0000000008", "0000000012") if (ck / f".tmp-step-{n}").exists())
                      or writing, timeout=120), r.out[-3000:]
    first = payload_of(r, "drafter:0")
    assert first
    os.kill(first, signal.SIGKILL)
    # 2. SIGKILL of the restarted drafter mid-step, once step 16's checkpoint committed.
    assert wait_until(lambda: (ck / "step-0000000016").exists(), timeout=120), r.out[-3000:]
    second = payload_of(r, "drafter:0")
    assert second and second != first
    os.kill(second, signal.SIGKILL)
    assert r.wait(timeout=300) == 0, r.out[-4000:] + r.err[-2000:]

    text = r.out + "".join(p.read_text(errors="replace") for p in r.run_dir.rglob("*.log"))
    resumed = {int(s) for s in re.findall(r"drafter:0: resumed from step (\d+)", text)}
    assert resumed == {int(writing[0]) - EVERY, 16}, text[-3000:]
    s = r.summary()
    p = by_name(s)["drafter:0"]
    assert p["restarts"] == 2, p
    # The metrics file as dflash_launch.Checkpoint writes it; the summary names the role's last checkpoint.
    assert p["metrics"]["resumed_from_step"] == 16, p["metrics"]
    assert p["metrics"]["steps"] == FRAMES - 16, p["metrics"]
    assert s["checkpoints"]["drafter"] == {"path": str(ck / f"step-{FRAMES:010d}"), "step": FRAMES}, s["checkpoints"]
    # The half-written checkpoint is gone; the last 3 stay.
    assert sorted(os.listdir(ck)) == ["step-0000000016", "step-0000000020", "step-0000000024"], os.listdir(ck)
    assert_committed_exactly_once(r)
    got = final_state(r)
    assert got.keys() == uninterrupted.keys() and any(k.startswith("optim.exp_avg_sq.") for k in got)
    for k in got:
        assert got[k].dtype == uninterrupted[k].dtype and got[k].shape == uninterrupted[k].shape, k
        assert bytes(got[k].numpy().tobytes()) == bytes(uninterrupted[k].numpy().tobytes()), k


def test_sigterm_writes_a_checkpoint_the_resumed_run_goes_on_from(launch, tmp_path, uninterrupted):
    """The run stopped (SIGTERM to dflash-launch, which stops its processes with SIGTERM): the drafter writes and
    commits a checkpoint at its next step, says so, and ends by the signal; the run continued with --resume resumes
    from that step and ends with every frame committed once and the weights of the run never stopped."""
    cfg = config(tmp_path, ', DFLASH_PACE_MS = "60"')
    cfg.write_text(cfg.read_text().replace(f'DFLASH_CHECKPOINT_EVERY = "{EVERY}"', 'DFLASH_CHECKPOINT_EVERY = "1000"'))
    r = launch(cfg, env=ENV, run_id="stopped")
    pending = tmp_path / "spool" / "stopped" / "pending" / "drafter:0"
    assert wait_until(lambda: pending.is_dir() and len(os.listdir(pending)) >= 6, timeout=120), r.out[-3000:]
    os.kill(r.pid, signal.SIGTERM)
    assert r.wait(timeout=120) != 0
    text = r.out + "".join(p.read_text(errors="replace") for p in r.run_dir.rglob("*.log"))
    m = set(re.findall(r"drafter:0: SIGTERM: checkpoint at step (\d+) committed", text))
    assert len(m) == 1, text[-3000:]
    stopped_at = int(m.pop())
    assert 6 <= stopped_at < FRAMES and (checkpoints(r) / f"step-{stopped_at:010d}").is_dir(), stopped_at
    r2 = launch(cfg, env=ENV, run_id="stopped", args=["--resume"])
    assert r2.wait(timeout=300) == 0, r2.out[-4000:] + r2.err[-2000:]
    text2 = r2.out + "".join(p.read_text(errors="replace") for p in r2.run_dir.rglob("*.log"))
    assert f"drafter:0: resumed from step {stopped_at} " in text2, text2[-3000:]
    assert_committed_exactly_once(r2, every=1000)
    got = final_state(r2)
    for k in got:
        assert got[k].numpy().tobytes() == uninterrupted[k].numpy().tobytes(), k


def drafter_env(tmp_path, **kw):
    env = {k: v for k, v in ENV.items() if not k.startswith("DFLASH_")}
    env.update(SMALL_ENV, DFLASH_SPOOL_DIR=str(tmp_path / "spool"), DFLASH_PROCESS="drafter:0",
               DFLASH_SPOOL_PRODUCERS="1", **kw)
    return env


@pytest.mark.parametrize("every, keep, said", [
    ("5", None, "DFLASH_CHECKPOINT_DIR is not set"),
    ("-1", None, "DFLASH_CHECKPOINT_EVERY must be 0 (none) or a number of steps"),
    ("5", "0", "DFLASH_CHECKPOINT_KEEP at least 1"),
])
def test_a_checkpoint_setting_that_cannot_work_is_a_clear_error(tmp_path, every, keep, said):
    env = drafter_env(tmp_path, DFLASH_CHECKPOINT_EVERY=every)
    if keep is not None:
        env.update(DFLASH_CHECKPOINT_KEEP=keep, DFLASH_CHECKPOINT_DIR=str(tmp_path / "ck"))
    r = run([BUILTIN, "drafter"], env=env)
    assert r.returncode == 64, r.stderr
    assert said in r.stderr, r.stderr
    assert not (tmp_path / "spool").exists() and not (tmp_path / "ck").exists()  # nothing touched


@pytest.mark.parametrize("kind", ["damaged", "weights-only", "no-identity", "another-model"])
def test_a_checkpoint_it_cannot_resume_from_is_refused_by_name(tmp_path, kind):
    """Never a silent fresh start, never a converted tensor: the newest committed checkpoint is unreadable with a
    frame in done/ naming it, not a drafter checkpoint, without a run identity (an older build's), or of another
    [model] (even with DFLASH_CHECKPOINT_ADOPT=1): exit 78 (a restart would find the same) naming it and what to do;
    it stays where it is."""
    (tmp_path / "spool").mkdir(mode=0o700)
    env = drafter_env(tmp_path, DFLASH_CHECKPOINT_EVERY="2", DFLASH_CHECKPOINT_DIR=str(tmp_path / "ck"))
    assert run([BUILTIN, "export-target", "--out", tmp_path / "spool" / "weights.safetensors"], env=env).returncode == 0
    step = tmp_path / "ck" / "drafter:0" / "step-0000000004"
    step.mkdir(parents=True, mode=0o700)
    bad = step / "drafter.safetensors"
    old_meta = {"format": "dflash-builtin-checkpoint/1", "step": "4", "optimizer_step": "4", "position": "4",
                "consumer": "drafter:0"}
    if kind == "damaged":
        bad.write_bytes(b"not a safetensors file")
        (tmp_path / "spool" / "done").mkdir(mode=0o700)
        (tmp_path / "spool" / "done" / "t:0-0000000003.safetensors").write_text(json.dumps({"checkpoint": str(step)}))
    elif kind == "weights-only":
        assert run([BUILTIN, "init-drafter", "--out", bad], env=env).returncode == 0
    elif kind == "no-identity":
        save_file({"fc.weight": torch.zeros(3, 3)}, str(bad), metadata=old_meta)
    else:
        save_file({"fc.weight": torch.zeros(3, 3)}, str(bad), metadata=old_meta)
        env["DFLASH_CHECKPOINT_ADOPT"] = "1"
    r = run([BUILTIN, "drafter"], env=env)
    assert r.returncode == 78, r.stderr
    said = {"damaged": "is damaged (", "weights-only": "is not a builtin drafter checkpoint",
            "no-identity": "has no run identity (written before dflash-launch recorded one)",
            "another-model": "does not match this drafter ([model]): fc.weight is F32 [3, 3]"}[kind]
    fix = {"damaged": "committed frame t:0-0000000003.safetensors (done/ names it)",
           "no-identity": "dflash-launch run --resume --run-id"}.get(kind, "fix:")
    assert f"drafter:0: cannot resume: " in r.stderr and said in r.stderr and str(step) in r.stderr, r.stderr
    assert fix in r.stderr and bad.exists(), r.stderr

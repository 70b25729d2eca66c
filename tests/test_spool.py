"""The hidden-state spool between processes (issue #6): exactly once whatever
process dies, restarted consumers take back their frames, restarted producers
resume; frames that violate [model] are rejected by both consumers (C++ and
Python) with the same message, and nothing is consumed from them."""
import json
import os
import re
import signal
import sys
import time

import pytest
import torch

from conftest import BIN, ROOT, run
from supervise import proc_table, stopped_when, wait_until, write_config

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch import contract_from_env  # noqa: E402
from dflash_launch.spool import (FrameContractError, SpoolProducer, SpoolSource, frame_file,  # noqa: E402
                                 manifest, parse_frame_file)

BUILTIN = BIN / "dflash-builtin"
needs_builtin = pytest.mark.skipif(not BUILTIN.exists(), reason="dflash-builtin not built (no LibTorch)")
VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}",
           PYTHONPATH=f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}")

SMALL = """
[model]
target_layers = 8
hidden = 32
tapped_layers = [1, 3, 5]
draft_layers = 1
block_size = 4
seq_len = 32
dtype = "fp32"
heads = 2
kv_heads = 1
vocab = 64
"""
SMALL_ENV = {
    "DFLASH_HIDDEN_SHAPE": "1,32,96", "DFLASH_TAPPED_LAYERS": "1,3,5", "DFLASH_TARGET_LAYERS": "8",
    "DFLASH_HIDDEN": "32", "DFLASH_DRAFT_LAYERS": "1", "DFLASH_BLOCK_SIZE": "4", "DFLASH_SEQ_LEN": "32",
    "DFLASH_BATCH": "1", "DFLASH_DTYPE": "fp32", "DFLASH_VOCAB": "64", "DFLASH_SEED": "0", "DFLASH_HEADS": "2",
    "DFLASH_KV_HEADS": "1",
}
CONTRACT = contract_from_env(SMALL_ENV)


def config(tmp_path, roles, run_extra=""):
    """run.toml in `tmp_path`: its spool under it, the small [model], `roles`; `run_extra`: more [run] keys."""
    return write_config(tmp_path, f'spool_dir = "{tmp_path}/spool"\n{run_extra}\n' + SMALL + roles)


def payload_of(run, name, marker="dflash-builtin"):
    """The pid of `name`'s payload, from the supervisor's log: the process it
    started (executed directly), or that process's child (behind a dflash-worker)."""
    log = (run.run_dir / "supervisor.log").read_text()
    started = int(log.split(f"{name} STARTING (pid ")[-1].split(",")[0].split(")")[0])
    table = proc_table()
    if started in table and marker in table[started][2] and "dflash-worker" not in table[started][2]:
        return started
    for pid, (ppid, state, cmd) in table.items():
        if ppid == started and marker in cmd and state != "Z":
            return pid
    return None


def by_name(summary):
    return {p["name"]: p for p in summary["processes"]}


@needs_builtin
def test_two_producers_three_consumers_sigkill_exactly_once(launch, tmp_path):
    restart = 'restart = { policy = "on-failure", max = 2, window = "1h", backoff = "300ms..300ms" }'
    r = launch(config(tmp_path, f"""
[[role]]
name = "target"
cpu = 2
builtin = "target"
env = {{ DFLASH_SAMPLES = "120", DFLASH_SPOOL_MAX = "4" }}
{restart}

[[role]]
name = "drafter"
cpu = 3
builtin = "drafter"
env = {{ DFLASH_PACE_MS = "15" }}
{restart}
"""), env=ENV)
    done = tmp_path / "spool" / "r" / "done"
    assert wait_until(lambda: done.exists() and len(os.listdir(done)) >= 60), "no progress"
    victims = {name: payload_of(r, name) for name in ("drafter:1", "target:1")}
    assert all(victims.values()), victims
    # Mid-run: the drafter holds a frame (stopped while it does: a kill aimed near it could land between frames on
    # a loaded machine), the target is publishing.
    held = tmp_path / "spool" / "r" / "claimed" / "drafter:1"
    assert stopped_when(victims["drafter:1"], lambda: any(n.endswith(".safetensors") for n in os.listdir(held)))
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    assert r.wait(timeout=120) == 0, r.err
    s = by_name(r.summary())
    assert s["drafter:1"]["restarts"] == 1 and s["target:1"]["restarts"] == 1
    # The last line says that success took restarts, each by the process that failed (two independent ones: two
    # restarts, in the order the supervisor saw them); the training table has each builtin drafter (issue #39).
    story = r"(target:1|drafter:1) killed by SIGKILL(?: at step \d+)?(?:, resumed from step \d+)?"
    m = re.search(rf"all processes succeeded \(after 2 restarts: {story}; {story}\)", r.out + r.err)
    assert m and {m.group(1), m.group(2)} == {"target:1", "drafter:1"}, r.out[-2000:]
    for i in range(3):
        acked = s[f"drafter:{i}"]["metrics"]["frames_acked"]
        steps = s[f"drafter:{i}"]["training"]["steps"]  # every attempt's (issue #45): drafter:1's two
        # steps, loss first -> last, the mean of 10 first -> last ("-" under 20 steps), first step, spool frames, and
        # for a restarted one where it resumed
        assert re.search(rf"(?m)^drafter:{i} +{steps} +[0-9.]+ -> [0-9.]+ +(?:[0-9.]+ -> [0-9.]+|-) +[0-9.]+s +{acked}"
                         rf"(?: {{2,}}(?:resumed from step|restarted, no resume reported).*)?$", r.out + r.err), r.out
    assert s["drafter:1"]["training"]["steps"] >= s["drafter:1"]["metrics"]["steps"]
    # The restarted drafter took back the frame it held; the restarted target
    # resumed after its last published frame instead of starting over.
    assert s["drafter:1"]["metrics"]["taken_back"] == 1
    assert 0 < s["target:1"]["metrics"]["resumed_at"] < 120
    assert s["target:1"]["metrics"]["next_seq"] == 120
    # Every published frame consumed exactly once, checked by sequence numbers.
    m = json.loads((r.run_dir / "spool.json").read_text())
    assert m["final"] and m["exactly_once"], m
    assert m["frames_published"] == m["frames_consumed"] == 240
    for p in ("target:0", "target:1"):
        assert m["producers"][p] == {"published": 120, "consumed": 120, "first_seq": 0, "last_seq": 119,
                                     "missing": 0, "missing_seqs": [], "unexpected": 0, "unexpected_seqs": [],
                                     "committed_by": [[0, 119, None]]}  # acknowledged without a checkpoint
    steps = sum(s[f"drafter:{i}"]["metrics"]["frames_acked"] for i in range(3))
    assert steps <= 240  # the last attempts' acks; the killed attempt's are in done/ too
    assert not (tmp_path / "spool" / "r").exists()  # the supervisor removed the run's spool


def stacked_spool(root, layer_ids=None, stacked=True):
    """A spool holding one bad frame from producer "evil:0", and the target's weights."""
    p = SpoolProducer(root, "evil:0", CONTRACT)
    p.publish_weights(torch.randn(64, 32), torch.randn(64, 32))
    hidden = torch.randn(1, 32, 3, 32) if stacked else torch.randn(1, 32, 96)
    meta = {"layer_ids": layer_ids} if layer_ids else None
    p.publish(hidden, torch.randint(0, 63, (1, 32)), metadata=meta, check=False)
    p.finish()
    return p


STACKED_MESSAGE = """\
frame evil:0-0000000000.safetensors from producer evil:0 does not match [model]: taps stacked on a new axis: \
the drafter's fc reads them concatenated
  expected: [1, 32, 96] = [batch, seq_len, n_taps*hidden]: 3 taps of hidden 32 concatenated on the feature axis
  found:    stacked [1, 32, 3, 32]
  fix (in producer evil:0): concatenate the taps: torch.cat(taps, dim=-1); a stacked x of shape [1, 32, 3, 32] \
becomes x.reshape(1, 32, 96)"""


def consume(kind, root, tmp_path):
    env = dict(ENV, **SMALL_ENV, DFLASH_SPOOL_DIR=str(root), DFLASH_SPOOL_PRODUCERS="1",
               DFLASH_PROCESS="drafter:0", DFLASH_METRICS_FILE=str(tmp_path / f"{kind}.metrics.json"))
    if kind == "cpp":
        return run([BUILTIN, "drafter"], env=env)
    return run([sys.executable, "-m", "dflash_launch.roles.reference_drafter", "--source", "spool", "--no-compile"],
               env=env)


@needs_builtin
@pytest.mark.parametrize("kind", ["cpp", "python"])
def test_a_stacked_frame_is_rejected_and_nothing_is_consumed(tmp_path, kind):
    root = tmp_path / "spool"
    stacked_spool(root)
    r = consume(kind, root, tmp_path)
    assert r.returncode == 65, r.stderr
    assert STACKED_MESSAGE in r.stderr  # word for word the same from both consumers
    name = frame_file("evil:0", 0)
    assert (root / "rejected" / name).exists()
    assert STACKED_MESSAGE in (root / "rejected" / f"{name}.reason").read_text()
    assert os.listdir(root / "done") == [] and os.listdir(root / "ready") == []
    assert os.listdir(root / "claimed" / "drafter:0") == []
    m = json.loads((tmp_path / f"{kind}.metrics.json").read_text())
    assert m["steps"] == 0 and m["losses"] == []


@needs_builtin
@pytest.mark.parametrize("kind", ["cpp", "python"])
def test_a_wrong_tap_list_is_rejected(tmp_path, kind):
    root = tmp_path / "spool"
    stacked_spool(root, layer_ids="1,3,6", stacked=False)
    r = consume(kind, root, tmp_path)
    assert r.returncode == 65, r.stderr
    assert "from producer evil:0 does not match [model]: tapped layers differ from [model] tapped_layers" in r.stderr
    assert "expected: layer ids [1, 3, 5] (id i = output of layer i = HF hidden_states[i+1])" in r.stderr
    assert "found:    layer ids [1,3,6]" in r.stderr
    assert os.listdir(root / "done") == []


@needs_builtin
def test_a_stacked_producer_under_the_launcher_is_named(launch, tmp_path):
    """A user's Python target that publishes stacked frames: the drafter rejects
    the first one, exits 65 and is not restarted; the run says who and why."""
    producer = ("import torch; from dflash_launch import contract_from_env; from dflash_launch.spool import "
                "SpoolProducer; import os; c = contract_from_env(); "
                "p = SpoolProducer(os.environ['DFLASH_SPOOL_DIR'], os.environ['DFLASH_PROCESS'], c); "
                "p.publish_weights(torch.randn(64, 32), torch.randn(64, 32)); "
                "p.publish(torch.randn(1, 32, 3, 32), torch.zeros(1, 32, dtype=torch.long), check=False); p.finish()")
    r = launch(config(tmp_path, f"""
[[role]]
name = "evil"
cpu = 1
spool = "produce"
command = ["python", "-c", "{producer}"]

[[role]]
name = "drafter"
cpu = 1
builtin = "drafter"
restart = {{ policy = "on-failure", max = 3, no_restart_exit_codes = [65] }}
"""), env=ENV)
    assert r.wait(timeout=120) == 65, r.err
    s = r.summary()
    assert s["culprit"] == "drafter:0" and by_name(s)["drafter:0"]["restarts"] == 0
    err = (tmp_path / by_name(s)["drafter:0"]["log"]["stderr"]).read_text()
    assert "from producer evil:0 does not match [model]: taps stacked on a new axis" in err
    assert "x.reshape(1, 32, 96)" in err


@needs_builtin
def test_cpp_and_python_consumers_share_one_spool(launch, tmp_path):
    r = launch(config(tmp_path, """
[[role]]
name = "target"
cpu = 1
builtin = "target"
env = { DFLASH_SAMPLES = "60", DFLASH_SPOOL_MAX = "4" }

[[role]]
name = "cpp"
cpu = 1
builtin = "drafter"
# Slow, and at most half the frames: the Python drafter (import torch: seconds, more on a loaded machine) gets the
# rest however late it comes. Both checkpoint, and commit their frames with them, each the same way (issue #45).
env = { DFLASH_PACE_MS = "100", DFLASH_STEPS = "30", DFLASH_CHECKPOINT_EVERY = "5" }

[[role]]
name = "py"
cpu = 1
command = ["python", "-m", "dflash_launch.roles.reference_drafter", "--source", "spool", "--no-compile", "--steps", "1000",
           "--checkpoint-every", "5"]
"""), env=ENV)
    assert r.wait(timeout=120) == 0, r.err
    s = by_name(r.summary())
    a, b = s["cpp:0"]["metrics"]["frames_acked"], s["py:0"]["metrics"]["frames_acked"]
    assert a + b == 60 and a > 0 and b > 0, (a, b)
    m = json.loads((r.run_dir / "spool.json").read_text())
    assert m["exactly_once"] and m["producers"]["target:0"]["consumed"] == 60 and m["pending"] == 0, m
    # Every frame committed once, by a checkpoint of the process that trained on it, whichever language.
    by = m["committed_by_checkpoint"]
    assert sum(by.values()) == 60, by
    assert sum(n for ck, n in by.items() if "/checkpoints/cpp/cpp:0/step-" in ck) == a, by
    assert sum(n for ck, n in by.items() if "/checkpoints/py/" in ck) == b, by
    assert set(s) >= {"cpp:0", "py:0"} and set(r.summary()["checkpoints"]) == {"cpp", "py"}


# --- the Python side of the protocol, without processes -------------------------

def test_python_source_takes_back_its_claims_and_acks_once(tmp_path):
    root = tmp_path / "s"
    p = SpoolProducer(root, "t:0", CONTRACT)
    p.publish_weights(torch.randn(64, 32), torch.randn(64, 32))
    for _ in range(3):
        p.publish(torch.randn(1, 32, 96), torch.randint(0, 63, (1, 32)))
    src1 = SpoolSource(root, "d:0", CONTRACT, producers=1)
    first = iter(src1)
    s0 = next(first)
    s0["ack"]()
    next(first)  # claimed, never acknowledged: this attempt "dies"
    p.finish()
    again = SpoolSource(root, "d:0", CONTRACT, producers=1)
    got = []
    for x in again:
        got.append((x["seq"], x["taken_back"]))
        x["ack"]()
    assert got == [(1, True), (2, False)]
    assert again.stats()["taken_back"] == 1 and again.manifest_written
    m, final = manifest(root, 1)
    assert final and m["exactly_once"] and m["producers"]["t:0"]["consumed"] == 3
    assert sorted(parse_frame_file(f)[1] for f in os.listdir(root / "done")) == [0, 1, 2]
    # A frame's bytes go after its ack and its last view: s0 still maps frame 0, x (the last sample) frame 2.
    sizes = {parse_frame_file(f)[1]: os.path.getsize(root / "done" / f) for f in os.listdir(root / "done")}
    assert sizes[1] == 0 and sizes[0] > 0 and sizes[2] > 0, sizes
    assert x["hidden"].shape == (1, 32, 96) and again.release() == 1 and src1.release() == 1
    del x, s0
    assert again.release() == 0 and src1.release() == 0
    assert all(os.path.getsize(root / "done" / f) == 0 for f in os.listdir(root / "done"))
    w = again.shared_weights()
    assert w["embed.weight"].shape == (64, 32)


def test_python_producer_writes_the_manifest_when_the_last_ack_came_first(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_SPOOL_PRODUCERS", "1")
    monkeypatch.setenv("DFLASH_RUN_DIR", str(tmp_path))
    root = tmp_path / "s"
    monkeypatch.setenv("DFLASH_SPOOL_DIR", str(root))
    p = SpoolProducer(root, "t:0", CONTRACT)
    p.publish(torch.randn(1, 32, 96), torch.zeros(1, 32, dtype=torch.long))
    src = SpoolSource.from_env(CONTRACT, "d:0")
    sample = next(iter(src))
    sample["ack"]()  # a drafter capped by --steps stops here, before the producer's marker
    assert not src.manifest_written and not (tmp_path / "spool.json").exists()
    p.finish()
    assert json.loads((tmp_path / "spool.json").read_text())["exactly_once"]


def test_python_producer_resumes_and_checks_its_own_output(tmp_path):
    root = tmp_path / "s"
    p = SpoolProducer(root, "t:0", CONTRACT)
    p.publish(torch.randn(1, 32, 96), torch.zeros(1, 32, dtype=torch.long))
    (root / "tmp" / (frame_file("t:0", 1) + ".tmp")).write_bytes(b"half")
    with pytest.raises(Exception, match="stacked"):
        p.publish(torch.randn(1, 32, 3, 32), torch.zeros(1, 32, dtype=torch.long))  # the producer's end
    again = SpoolProducer(root, "t:0", CONTRACT)
    assert again.next_seq == 1 and os.listdir(root / "tmp") == []


def test_python_frame_errors_are_contract_errors(tmp_path):
    root = tmp_path / "s"
    stacked_spool(root)
    src = SpoolSource(root, "d:0", CONTRACT, producers=1)
    with pytest.raises(FrameContractError) as e:
        next(iter(src))
    assert str(e.value) == STACKED_MESSAGE and e.value.producer == "evil:0" and e.value.exit_code == 65


@needs_builtin
def test_the_spool_is_gone_after_the_run_and_a_planted_link_is_not_followed(launch, tmp_path):
    """The run removes its spool without following a link in it (a symlink planted mid-run to a directory of
    someone else's keeps that directory's files), and the spool root too once that left it empty."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    r = launch(config(tmp_path, """
[[role]]
name = "target"
cpu = 1
builtin = "target"
env = { DFLASH_SAMPLES = "20", DFLASH_SPOOL_MAX = "2" }

[[role]]
name = "drafter"
cpu = 1
builtin = "drafter"
env = { DFLASH_PACE_MS = "200" }
"""), env=ENV)
    run_spool = tmp_path / "spool" / r.run_dir.name
    deadline = time.monotonic() + 120
    while not run_spool.is_dir() and r.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run_spool.is_dir(), r.err
    os.symlink(victim, run_spool / "planted")
    assert r.wait(timeout=180) == 0, r.err
    assert (victim / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "spool").exists(), list((tmp_path / "spool").rglob("*"))

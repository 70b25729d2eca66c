"""Who feeds the spool and who reads it (issue #20, items 2 and 3): a warm-up
never takes a real frame (it gets synthetic ones, and is stopped if it never
says READY); a Python target role says `spool = "produce"`, counts in
DFLASH_SPOOL_PRODUCERS, and the drafters' sources end by themselves, exactly
once; a producer's own contract error exits 65 and is never restarted."""
import importlib.util
import json
import os
import sys

import pytest
import torch

from conftest import BIN, ROOT, run
from supervise import write_config
from test_spool import CONTRACT, ENV, SMALL, SMALL_ENV, by_name, needs_builtin

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch.spool import (SpoolError, SpoolProducer, SpoolSource, WARMUP_FRAMES, WarmupSpent,  # noqa: E402
                                 FrameContractError)

# Found, not imported: every pytest worker collects this module, and the import costs ~0.7 CPU-s.
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")

# A drafter script that knows nothing of warm-ups (most do not): it reads the
# spool until it ends, logs every frame it trained on, and never says READY
# (the role is ready when it exits).
UNAWARE_DRAFTER = r"""
import json, os, torch
from dflash_launch import contract_from_env
from dflash_launch.spool import SpoolSource
c = contract_from_env()
name = os.environ["DFLASH_PROCESS"]
src = SpoolSource.from_env(c, name)
w = src.shared_weights()["embed.weight"]
fc = torch.nn.Linear(len(c["tapped_layers"]) * c["hidden"], c["hidden"])
opt = torch.optim.SGD(fc.parameters(), lr=1e-3)
log = open(os.path.join(os.environ["FRAME_LOG"], name.replace(":", "-") + ".jsonl"), "a")
for s in src:
    loss = (fc(s["hidden"].float()) @ w.T).logsumexp(-1).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    s["ack"]()
    log.write(json.dumps({"frame": s["frame"], "producer": s["producer"], "seq": s["seq"]}) + "\n"); log.flush()
"""


def config(tmp_path, roles):
    return write_config(tmp_path, f'spool_dir = "{tmp_path}/spool"\n' + SMALL + roles)


def frame_log(tmp_path):
    out = {}
    for f in sorted(os.listdir(tmp_path / "frames")):
        out[f[:-6]] = [json.loads(line) for line in (tmp_path / "frames" / f).read_text().splitlines()]
    return out


@needs_builtin
def test_a_warmup_unaware_drafter_takes_no_real_frame(launch, tmp_path):
    """Gate mode "warmup" (auto for a gated role of 2) runs the drafter's script
    with DFLASH_WARMUP=1 first. Before: it trained on the real spool as a full
    job and consumed real frames (all 40 here); now it gets WARMUP_FRAMES
    synthetic frames, is stopped with a message, and both real drafters share
    all 40 real frames, exactly once."""
    (tmp_path / "frames").mkdir()
    script = tmp_path / "unaware.py"
    script.write_text(UNAWARE_DRAFTER)
    r = launch(config(tmp_path, f"""
[[role]]
name = "target"
cpu = 1
builtin = "target"
env = {{ DFLASH_SAMPLES = "40", DFLASH_SPOOL_MAX = "4" }}

[[role]]
name = "drafter"
cpu = 2
command = ["python", "{script}"]
gate = true
ready = "exit"
env = {{ FRAME_LOG = "{tmp_path / 'frames'}" }}
"""), env=ENV)
    assert r.wait(timeout=300) == 0, r.err
    s = r.summary()
    (warm,) = s["warmups"]
    assert warm["name"] == "drafter:warmup" and warm["exit_code"] == 0
    log = frame_log(tmp_path)
    # The warm-up trained on synthetic frames only, and no more than its budget.
    assert [x["frame"] for x in log["drafter-warmup"]] == [None] * WARMUP_FRAMES
    assert {x["producer"] for x in log["drafter-warmup"]} == {"(warm-up)"}
    err = (r.run_dir / "attempt_0" / "drafter-warmup.stderr.log").read_text()
    assert f"warm-up stopped after {WARMUP_FRAMES} synthetic frames" in err
    assert "dflash_launch.notify_ready()" in err and "dflash_launch.is_warmup()" in err and "docs/builtin.md" in err
    # Every real frame reached a real drafter, exactly once (manifest and the drafters' own logs).
    real = [x for k in ("drafter-0", "drafter-1") for x in log.get(k, [])]
    assert sorted(x["seq"] for x in real) == list(range(40))
    m = json.loads((r.run_dir / "spool.json").read_text())
    assert m["final"] and m["exactly_once"] and m["producers"]["target:0"]["consumed"] == 40, m
    assert list(m["producers"]) == ["target:0"]


def test_a_warmup_source_and_producer_stay_off_the_spool(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_WARMUP", "1")
    root = tmp_path / "s"
    p = SpoolProducer(root, "t:warmup", CONTRACT)
    src = SpoolSource(root, "d:warmup", CONTRACT, producers=1)
    assert p.publish_weights(torch.randn(64, 32), torch.randn(64, 32)) is False
    w = src.shared_weights()  # at once: nothing to wait for
    assert w["embed.weight"].shape == (64, 32)
    it = iter(src)
    frames = [next(it) for _ in range(WARMUP_FRAMES)]
    assert all(f["hidden"].shape == (1, 32, 96) and f["hidden"].dtype == torch.float32 for f in frames)
    assert all(f["tokens"].dtype == torch.long and int(f["tokens"].max()) < 64 for f in frames)
    with pytest.raises(WarmupSpent) as e:  # raised, not exited: the process's entry point (or from_env) decides
        next(it)
    assert e.value.exit_code == 0
    assert "without saying READY" in capsys.readouterr().err
    for _ in range(WARMUP_FRAMES):
        p.publish(torch.randn(1, 32, 96), torch.zeros(1, 32, dtype=torch.long))
    with pytest.raises(FrameContractError, match="stacked"):  # a warm-up still checks what it would publish
        p.publish(torch.randn(1, 32, 3, 32), torch.zeros(1, 32, dtype=torch.long))
    p.finish()
    assert not root.exists()  # neither touched the spool


def test_from_env_needs_only_the_environment(tmp_path, monkeypatch):
    root = tmp_path / "s"
    env = dict(SMALL_ENV, DFLASH_SPOOL_DIR=str(root), DFLASH_RUN_DIR=str(tmp_path / "run"),
               DFLASH_PROCESS="target:0")
    (tmp_path / "run").mkdir()
    with pytest.raises(SpoolError, match='spool = "produce"'):
        SpoolSource.from_env(CONTRACT, "d:0", env=dict(env, DFLASH_SPOOL_PRODUCERS="0"))
    env["DFLASH_SPOOL_PRODUCERS"] = "1"
    p = SpoolProducer.from_env(CONTRACT, env=env)
    src = SpoolSource.from_env(CONTRACT, env=dict(env, DFLASH_PROCESS="d:0"))
    assert p.name == "target:0" and src.name == "d:0" and src.producers == p.producers == 1
    p.publish(torch.randn(1, 32, 96), torch.zeros(1, 32, dtype=torch.int32))  # int ids become int64
    p.finish()
    assert [x["ack"]() or x["seq"] for x in src] == [0]
    # The manifest lives in the run dir: the spool dir is deleted after the run.
    assert json.loads((tmp_path / "run" / "spool.json").read_text())["exactly_once"]
    assert not (root / "spool.json").exists()
    # Constructed by hand (producers given), the manifest still goes to $DFLASH_RUN_DIR.
    monkeypatch.setenv("DFLASH_RUN_DIR", str(tmp_path / "run"))
    assert SpoolSource(root, "d:1", CONTRACT, producers=1).manifest_path == str(tmp_path / "run" / "spool.json")


def test_only_a_consumer_that_checkpoints_makes_pending(tmp_path):
    """dflash-launch keeps a failed run's spool for `run --resume` exactly when pending/ exists: a spool whose
    consumers acknowledge straight to done/ must not have one, or every failed run would keep its frames."""
    root = tmp_path / "s"
    p = SpoolProducer(root, "target:0", CONTRACT)
    plain = SpoolSource(root, "d:0", CONTRACT, producers=1)
    for _ in range(2):
        p.publish(torch.randn(1, 32, 96), torch.zeros(1, 32, dtype=torch.long))
    p.finish()
    it = iter(plain)
    next(it)["ack"]()
    assert not (root / "pending").exists() and len(os.listdir(root / "done")) == 1
    held = SpoolSource(root, "d:1", CONTRACT, producers=1)
    held.hold_for_checkpoint()
    next(iter(held))["ack"]()
    assert [len(os.listdir(root / "pending" / "d:1")), len(os.listdir(root / "done"))] == [1, 1]


def test_spool_produce_counts_in_the_plan(bin_dir, tmp_path):
    cfg = config(tmp_path, """
[[role]]
name = "target"
cpu = 2
spool = "produce"
command = ["python", "target.py"]

[[role]]
name = "cpp"
cpu = 1
builtin = "target"

[[role]]
name = "drafter"
cpu = 2
spool = "consume"
command = ["python", "drafter.py"]
""")
    for script in ("target.py", "drafter.py"):  # `check` looks for the scripts the roles run (from the cwd)
        (tmp_path / script).write_text("")
    r = run([bin_dir / "dflash-launch", "check", cfg, "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert {p["env"]["DFLASH_SPOOL_PRODUCERS"] for p in plan["processes"]} == {"3"}
    assert [(x["name"], x["spool"]) for x in plan["roles"]] == [("target", "produce"), ("cpp", "produce"),
                                                                ("drafter", "consume")]


def test_a_builtin_drafter_cannot_produce(bin_dir, tmp_path):
    cfg = config(tmp_path, """
[[role]]
name = "drafter"
cpu = 1
builtin = "drafter"
spool = "produce"
""")
    r = run([bin_dir / "dflash-launch", "check", cfg])
    assert r.returncode == 2
    assert 'run.toml:' in r.stderr and 'spool' in r.stderr and 'builtin = "drafter" cannot produce frames' in r.stderr
    assert 'remove spool' in r.stderr


def test_a_consumer_without_a_producer_is_a_config_error(bin_dir, tmp_path):
    """Before: `check` passed a spool = "consume" role with no producer, and the run burnt its restarts on
    SpoolSource.from_env's refusal of DFLASH_SPOOL_PRODUCERS=0. Now `check` and `run` name the role's spool key,
    exit 2 and start nothing (no run dir)."""
    cfg = config(tmp_path, """
[[role]]
name = "target"
cpu = 1
command = ["python", "target.py"]

[[role]]
name = "drafter"
cpu = 2
spool = "consume"
restart = { policy = "on-failure", max = 3 }
command = ["python", "drafter.py"]
""")
    for script in ("target.py", "drafter.py"):
        (tmp_path / script).write_text("raise SystemExit(1)\n")
    lines = cfg.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if t.startswith('spool = "consume"'))
    for verb in ("check", "run"):
        r = run([bin_dir / "dflash-launch", verb, cfg], cwd=tmp_path)
        assert r.returncode == 2, (verb, r.stdout, r.stderr)
        assert f"{cfg}:{line}:9: error: role[drafter].spool: nothing produces the frames this role consumes" in r.stderr
        assert 'spool = "produce"' in r.stderr and "nothing was started" in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing spawned, no run dir


@needs_transformers
def test_a_python_target_role_of_two_and_gated_drafters_end_by_themselves(launch, tmp_path):
    """The normal DFlash case: an HF target (a random Qwen3 here) in a role of
    2 processes with spool = "produce", and gated drafters. Nobody passes a
    producer count: the run ends by itself, every frame consumed exactly once."""
    r = launch(config(tmp_path, """
[[role]]
name = "target"
cpu = 2
spool = "produce"
command = ["python", "-m", "dflash_launch.roles.hf_target", "--random-qwen3", "--samples", "12", "--max-ready", "4"]

[[role]]
name = "drafter"
cpu = 2
gate = true
command = ["python", "-m", "dflash_launch.roles.reference_drafter", "--source", "spool", "--no-compile", "--steps", "1000"]
"""), env=ENV)
    assert r.wait(timeout=600) == 0, r.err
    s = r.summary()
    assert [w["name"] for w in s["warmups"]] == ["drafter:warmup"]
    m = json.loads((r.run_dir / "spool.json").read_text())
    assert m["final"] and m["exactly_once"] and m["producers_expected"] == 2, m
    for p in ("target:0", "target:1"):
        assert m["producers"][p]["published"] == m["producers"][p]["consumed"] == 12
    procs = by_name(s)
    assert procs["drafter:0"]["metrics"]["frames_acked"] + procs["drafter:1"]["metrics"]["frames_acked"] == 24
    assert procs["target:0"]["metrics"]["frames"] == 12 and procs["target:0"]["metrics"]["impl"] == "hf_target"
    # One process won the shared weights: the target's embedding, [vocab, hidden].
    assert sum(procs[p]["metrics"]["weights_published"] for p in ("target:0", "target:1")) == 1


def test_a_stacked_producer_exits_65_and_is_not_restarted(launch, tmp_path):
    """A Python target that stacks its taps: SpoolProducer.publish refuses it
    with the consumers' words, the process exits 65 (not Python's 1), and the
    restart policy does not retry it although 65 is not in no_restart_exit_codes."""
    producer = ("import torch; from dflash_launch import contract_from_env; from dflash_launch.spool import "
                "SpoolProducer; p = SpoolProducer.from_env(contract_from_env()); "
                "p.publish(torch.randn(1, 32, 3, 32), torch.zeros(1, 32, dtype=torch.long))")
    r = launch(config(tmp_path, f"""
[[role]]
name = "target"
cpu = 1
spool = "produce"
command = ["python", "-c", "{producer}"]
restart = {{ policy = "on-failure", max = 3, backoff = "100ms..100ms" }}
"""), env=ENV)
    assert r.wait(timeout=120) == 65, r.err
    s = r.summary()
    assert s["culprit"] == "target:0" and by_name(s)["target:0"]["restarts"] == 0
    err = (tmp_path / by_name(s)["target:0"]["log"]["stderr"]).read_text()
    assert "frame target:0-0000000000.safetensors from producer target:0 does not match [model]" in err
    assert "taps stacked on a new axis" in err and "x.reshape(1, 32, 96)" in err
    assert err.count("Traceback") == 1  # one attempt

"""The gate key follows the code that is compiled (issue #20): a drafter script
that imports its model from a module of its own, on real torch.compile; a
missing script is a config error before anything starts; gate_role() in a
warm-up-mode role."""
import json
import os
import shutil
import sys

from conftest import ROOT, run
from supervise import reused_without_compiling, write_config

VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "python"))
OWN_MODEL = ROOT / "tests" / "payloads" / "own_model"
PY = sys.executable


def own_model_role(script="train_drafter.py"):
    # A warm-up, then the one rank starts on its cache (one is enough: each process is ~5 CPU-s of torch and
    # Dynamo, and the run is made three times).
    return f"""
[[role]]
name = "drafter"
cpu = 1
command = ["{PY}", "{script}"]
cwd = "work"
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1" }}
gate = {{ mode = "warmup" }}
ready = {{ mode = "notify", timeout = "10m" }}
"""


def run_once(launch, cfg, run_id):
    r = launch(cfg, env=ENV, run_id=run_id)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    (warm,) = s["warmups"]
    ranks = [p for p in s["processes"] if p["role"] == "drafter"]
    assert len(ranks) == 1
    for p in ranks:  # the promise kept: nobody compiles on its own
        assert reused_without_compiling(p["metrics"]), (p["name"], p)
        assert p["metrics"]["gate_role"] == "reuse", p["metrics"]  # gate_role() in a warm-up-mode role
    assert s["warnings"] == [], s["warnings"]
    return r, warm, ranks


def test_editing_the_imported_model_module_compiles_again_and_names_it(launch, bin_dir, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for f in ("train_drafter.py", "drafter_model.py"):
        shutil.copy(OWN_MODEL / f, work / f)
    cfg = write_config(tmp_path, own_model_role())
    plan = json.loads(run([bin_dir / "dflash-launch", "check", cfg, "--json"], env=ENV).stdout)
    files = {f["why"]: f for f in plan["roles"][0]["gate"]["key_files"]}
    assert files["import drafter_model"]["path"] == str(work / "drafter_model.py"), files
    assert not any("torch" in why for why in files), files  # the install's modules are its version's business

    _, warm, _ = run_once(launch, cfg, "r1")
    assert warm["gate"]["role"] == "lead" and warm["gate"]["state"] == "ready"
    assert warm["metrics"]["fxgraph_cache_miss"] > 0

    model = work / "drafter_model.py"
    model.write_text(model.read_text().replace("torch.relu(", "torch.tanh("))
    r, warm, ranks = run_once(launch, cfg, "r2")
    assert warm["gate"]["role"] == "lead" and warm["gate"]["state"] == "ready", warm  # not the stale READY
    assert warm["metrics"]["fxgraph_cache_miss"] > 0
    log = (r.run_dir / "attempt_0" / "drafter-warmup.stderr.log").read_text()
    assert "the code changed since READY(drafter-" in log and f"{model} changed" in log, log
    assert ranks[0]["metrics"]["out"] != 0

    _, warm, _ = run_once(launch, cfg, "r3")  # unchanged: nothing compiles at all
    assert warm["gate"]["role"] == "reuse", warm


def test_a_missing_script_is_a_config_error_and_nothing_starts(bin_dir, tmp_path):
    (tmp_path / "work").mkdir()
    marker = tmp_path / "started"
    other = f"""
[[role]]
name = "target"
cpu = 1
command = ["sh", "-c", "touch {marker}"]
"""
    cfg = write_config(tmp_path, other + own_model_role("train_drafer.py"))
    line = cfg.read_text().splitlines().index(f'command = ["{PY}", "train_drafer.py"]') + 1
    for cmd in ("check", "run"):
        r = run([bin_dir / "dflash-launch", cmd, cfg], env=ENV)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert f"{cfg}:{line}:11: error: role[drafter].command" in r.stderr, r.stderr
        assert "would run `train_drafer.py`, which is not found" in r.stderr, r.stderr
        assert str(tmp_path / "work" / "train_drafer.py") in r.stderr
    assert not marker.exists()  # nothing was spawned
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())

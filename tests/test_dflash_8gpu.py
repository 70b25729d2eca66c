"""configs/dflash-8gpu.toml, the real job (issue #39, item 5): it runs shipped code only (hf_target over a local
checkpoint, the reference drafter as a DDP world), `check` passes it given a model path and refuses it without
one, and its CPU-scaled twin (dflash_launch.roles.pipeline_twin: the same roles and commands, a tiny [model], a tiny
Qwen3 saved to disk and loaded with from_pretrained) runs to the end: 5 targets, a warm-up that compiles, 3 DDP
ranks that take the same number of steps on 110 frames (the tail padded), every frame exactly once and committed
with the drafters' last checkpoint, and a loss that falls below what uniform random ids (hf_target's data before)
would allow."""
import importlib.util
import math
import json
import os
import sys
import tomllib

import pytest

from conftest import BIN, ROOT, run

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch.roles import pipeline_twin  # noqa: E402

SHIPPED = ROOT / "configs" / "dflash-8gpu.toml"
VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}",
           PYTHONPATH=f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}")
ENV.pop("DFLASH_TARGET_MODEL", None)

# Found, not imported: every pytest worker collects this module, and the import costs ~0.7 CPU-s.
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def test_check_passes_it_given_a_model_path_and_refuses_it_without(bin_dir, tmp_path):
    r = run([bin_dir / "dflash-launch", "check", SHIPPED], env=ENV, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    line, col = next((i, t.index('"${DFLASH_TARGET_MODEL}"') + 1)
                     for i, t in enumerate(SHIPPED.read_text().splitlines(), 1) if "${DFLASH_TARGET_MODEL}" in t)
    assert f"{SHIPPED}:{line}:{col}: error: role[target].command[4]: ${{DFLASH_TARGET_MODEL}} is unset" in r.stderr
    assert "export DFLASH_TARGET_MODEL=" in r.stderr and "nothing was started" in r.stderr
    r = run([bin_dir / "dflash-launch", "check", SHIPPED, "--json"], env=dict(ENV, DFLASH_TARGET_MODEL="/m/Qwen3"),
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    procs = plan["processes"]
    assert len(procs) == 8 and plan["world_size"] == 8
    assert sorted(p["env"]["CUDA_VISIBLE_DEVICES"] for p in procs) == [str(i) for i in range(8)]
    assert all(p["env"]["LOCAL_RANK"] == "0" for p in procs)
    assert plan["model"]["hidden_shape"] == [1, 2000, 25600] and plan["model"]["fc"] == [25600, 5120]
    targets = [p for p in procs if p["role"] == "target"]
    drafters = [p for p in procs if p["role"] == "drafter"]
    # Shipped code: hf_target over the given checkpoint, the reference drafter as one DDP world.
    assert all(p["argv"][-6:] == ["-m", "dflash_launch.roles.hf_target", "--model", "/m/Qwen3", "--samples", "2000"]
               for p in targets), targets[0]["argv"]
    assert all("dflash_launch.roles.reference_drafter" in p["argv"] and "--ddp" in p["argv"] for p in drafters)
    assert {p["env"]["DFLASH_SPOOL_PRODUCERS"] for p in procs} == {"5"}
    assert {p["gate_key"] for p in drafters} == {drafters[0]["gate_key"]}  # one key for the role
    roles = {r["name"]: r for r in plan["roles"]}
    assert roles["drafter"]["world"] == "role" and roles["target"]["world"] == "none"


def test_the_twin_changes_only_shapes_devices_frames_and_dirs(tmp_path):
    shipped = tomllib.loads(SHIPPED.read_text())
    twin = tomllib.loads(pipeline_twin.twin_config(SHIPPED.read_text(), str(tmp_path)))
    assert twin["model"] == pipeline_twin.TWIN_MODEL["cpu"]
    assert twin["model"]["tapped_layers"] == shipped["model"]["tapped_layers"]
    for a, b in zip(shipped["role"], twin["role"]):
        a, b = dict(a), dict(b)
        assert b.pop("cpu") == len(a.pop("devices"))
        a["command"] = [x if x != "2000" else str(pipeline_twin.SAMPLES) for x in a["command"]]
        assert a == b  # command, spool, gate, ready, restart, world, stop: as shipped
    assert {k: v for k, v in twin["run"].items() if k not in ("cache_dir", "spool_dir", "log_dir")} == \
        {k: v for k, v in shipped["run"].items() if k != "log_dir"}
    on_one_gpu = tomllib.loads(pipeline_twin.twin_config(SHIPPED.read_text(), str(tmp_path), "cuda", 1))
    assert [r["devices"] for r in on_one_gpu["role"]] == [[0] * 5, [0]] and on_one_gpu["run"]["share_gpus"]
    on_eight = tomllib.loads(pipeline_twin.twin_config(SHIPPED.read_text(), str(tmp_path), "cuda", 8))
    assert [r["devices"] for r in on_eight["role"]] == [[0, 1, 2, 3, 4], [5, 6, 7]]
    with pytest.raises(ValueError, match="changed shape"):
        pipeline_twin.twin_config(SHIPPED.read_text().replace("[5, 6, 7]", "[5, 6]"), str(tmp_path))


@pytest.mark.long
@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.skipif(not (BIN / "dflash-launch").exists(), reason="dflash-launch is not built")
def test_the_cpu_twin_runs_to_the_end(tmp_path):
    r = pipeline_twin.run_twin(SHIPPED, str(tmp_path), str(BIN / "dflash-launch"), env=ENV, timeout_s=900)
    console = (tmp_path / "twin.console.txt").read_text()
    assert r["ok"], (r, console[-4000:])
    summary = json.loads((tmp_path / "runs" / "twin" / "summary.json").read_text())
    procs = {p["name"]: p for p in summary["processes"]}
    # Five targets loaded the checkpoint from disk and published 22 frames each; 110 consumed exactly once.
    for i in range(5):
        m = procs[f"target:{i}"]["metrics"]
        assert m["model"] == str(tmp_path / "checkpoint") and m["frames"] == 22 and m["tokens"] == "token chain"
    assert r["frames"] == 110 and r["exactly_once"]
    # The drafters checkpoint as shipped (every 200 steps: none due in 37): the one at the end commits all 110
    # frames, and the loop's own finish() after the source's end agrees that nothing is new (issue #45's hang).
    last_ckpt = tmp_path / "runs" / "twin" / "checkpoints" / "drafter" / "step-0000000037"
    assert summary["checkpoints"]["drafter"] == {"path": str(last_ckpt), "step": 37}, summary["checkpoints"]
    spool = json.loads((tmp_path / "runs" / "twin" / "spool.json").read_text())
    assert spool["committed_by_checkpoint"] == {str(last_ckpt): 110}, spool["committed_by_checkpoint"]
    # One warm-up compiled; the 3 DDP ranks reused its cache and took ceil(110 / 3) = 37 steps each, one padded.
    (warmup,) = summary["warmups"]
    assert warmup["gate"]["role"] == "lead" and warmup["exit_code"] == 0
    assert r["drafter_steps"] == [37, 37, 37] and r["padded"] == 1
    last = []
    for i in range(3):
        m = procs[f"drafter:{i}"]["metrics"]
        assert procs[f"drafter:{i}"]["gate"]["role"] == "reuse" and m["ddp_world"] == 3
        last += m["losses"][-5:]
    # The token chain is learnable: uniform random ids over vocab-1 ids cannot go below ln(vocab-1) = 5.54.
    floor = math.log(pipeline_twin.TWIN_MODEL["cpu"]["vocab"] - 1)
    assert sum(last) / len(last) < floor - 0.15, (floor, last)
    # The run's summary: a training row per drafter, the curves, and the final line.
    for i in range(3):
        assert f"\ndrafter:{i}     37 " in console
    assert "loss curves: " in console and "run twin: all processes succeeded" in console

"""`python -m dflash_launch.tools.gpu_check`: its CPU mode (no GPU here; what it reports: tests/gpu_check_report.py),
its refusals, and the parts a GPU host exercises, with fakes. And the reference drafter's flex_attention path
(what the check compiles on CUDA) masks exactly like SDPA's dense mask."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run
from gpu_check_report import check_cpu_report

LONG = os.environ.get("DFLASH_LONG_TESTS") == "1"
ENV = dict(os.environ, PYTHONPATH=f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}")


def test_flex_block_mask_is_the_dense_mask():
    sys.path.insert(0, str(ROOT / "python"))
    from dflash_launch.roles.reference_drafter import build, pick_attention
    c = dict(tapped_layers=[1, 16, 31, 46, 61], hidden=64, heads=4, kv_heads=2, seed=0, vocab=256, draft_layers=2,
             block_size=4, seq_len=64)
    h, t = torch.randn(1, 64, 320), torch.randint(0, 255, (1, 64))
    dense, flex = build(c), build(c)
    flex.use_flex_attention("cpu")
    with torch.no_grad():  # flex_attention has no backward on CPU: forward only here
        a, b = dense.loss(h, t), flex.loss(h, t)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a.item(), b.item())
    # a mask that differs by one position gives another loss: the comparison can fail
    dense.mask[5, 0] = ~dense.mask[5, 0]
    with torch.no_grad():
        assert not torch.allclose(dense.loss(h, t), b, rtol=1e-5, atol=1e-6)
    assert pick_attention("auto", "cuda") == "flex" and pick_attention("auto", "cpu") == "sdpa"
    assert pick_attention("sdpa", "cuda") == "sdpa"


# The same check runs from the wheel's bundle in `make test-wheel` (CI: tests/test_wheel.py, the same assertions):
# here, on this checkout, only as a long variant (two runs of 3 compiling drafters).
@pytest.mark.skipif(torch.cuda.is_available(), reason="this test is the no-GPU mode; docs/gpu.md runs the GPU one")
@pytest.mark.skipif(not LONG, reason="DFLASH_LONG_TESTS=1; `make test-wheel` runs it from the wheel")
def test_cpu_mode_reports_every_check(bin_dir, tmp_path):
    out = tmp_path / "check"
    r = run([sys.executable, "-m", "dflash_launch.tools.gpu_check", "--out", out, "--launcher", bin_dir / "dflash-launch",
             "--steps", "2", "--timeout", "600"], env=ENV, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    check_cpu_report(json.loads((out / "report.json").read_text()), r.stdout, (out / "summary.txt").read_text(),
                     ROOT / "python" / "dflash_launch", steps=2)


def test_refuses_a_used_out_dir_and_a_missing_launcher(bin_dir, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    r = run([sys.executable, "-m", "dflash_launch.tools.gpu_check", "--out", used, "--launcher", bin_dir / "dflash-launch"],
            env=ENV)
    assert r.returncode == 64 and "not empty" in r.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"] and (used / "keep.txt").read_text() == "mine"
    r = run([sys.executable, "-m", "dflash_launch.tools.gpu_check", "--out", tmp_path / "o", "--launcher",
             tmp_path / "no-such-launcher"], env=ENV)
    assert r.returncode == 64 and "no dflash-launch" in r.stderr
    assert not (tmp_path / "o").exists()  # nothing made before the refusal


# The parts of the check a GPU host exercises, with fakes: a fake ldconfig and nvidia-smi on PATH, a driver dir
# in tmp_path, and the launcher's run replaced by a recorded summary.

def _gpu_check():
    sys.path.insert(0, str(ROOT / "python"))
    from dflash_launch.tools import gpu_check
    return gpu_check


def _fake_tool(dir, name, text):
    p = dir / name
    p.write_text("#!/bin/sh\ncat <<'EOF'\n" + text + "EOF\n")
    p.chmod(0o755)


def _host(tmp_path, libcuda_so, modes):
    """PATH with a fake ldconfig (libcuda.so.1 in tmp_path/drv) and nvidia-smi (these compute modes)."""
    tools, drv = tmp_path / "tools", tmp_path / "drv"
    tools.mkdir()
    drv.mkdir()
    (drv / "libcuda.so.1").write_text("")
    if libcuda_so:
        (drv / "libcuda.so").symlink_to(drv / "libcuda.so.1")
    _fake_tool(tools, "ldconfig", f"\tlibcuda.so.1 (libc6,x86-64) => {drv}/libcuda.so.1\n")
    _fake_tool(tools, "nvidia-smi", "".join(f"{i}, {m}\n" for i, m in enumerate(modes)))
    return {"PATH": f"{tools}:/usr/bin:/bin"}, drv


def test_preflight_names_a_missing_unversioned_libcuda_and_the_fix(tmp_path):
    gc = _gpu_check()
    env, drv = _host(tmp_path, libcuda_so=False, modes=["Default"])
    pf = gc.preflight("cuda", [0, 0, 0], True, env)
    assert pf["ok"] is False and pf["libcuda_dirs"] == [str(drv)] and pf["libcuda_so"] is None
    [problem] = pf["problems"]
    assert "no unversioned libcuda.so" in problem and "cannot find -lcuda" in problem
    assert f"ln -sf {drv}/libcuda.so.1" in problem and "TRITON_LIBCUDA_PATH" in problem
    (drv / "libcuda.so").symlink_to(drv / "libcuda.so.1")  # the fix
    pf = gc.preflight("cuda", [0, 0, 0], True, env)
    assert pf["ok"] is True and pf["problems"] == [] and pf["libcuda_so"] == f"{drv}/libcuda.so"
    # TRITON_LIBCUDA_PATH wins over ldconfig, as in Triton
    other = tmp_path / "other"
    other.mkdir()
    pf = gc.preflight("cuda", [0], False, dict(env, TRITON_LIBCUDA_PATH=str(other)))
    assert pf["libcuda_dirs"] == [str(other)] and not pf["ok"]


def test_preflight_refuses_exclusive_process_only_where_gpus_are_shared(tmp_path):
    gc = _gpu_check()
    env, _ = _host(tmp_path, libcuda_so=True, modes=["Exclusive_Process", "Default"])
    pf = gc.preflight("cuda", [0, 0, 0], True, env)  # one GPU, three drafters on it
    assert pf["ok"] is False and pf["compute_modes"] == {0: "Exclusive_Process", 1: "Default"}
    [problem] = pf["problems"]
    assert "GPU 0 is in compute mode Exclusive_Process" in problem and "nvidia-smi -i 0 -c DEFAULT" in problem
    assert gc.preflight("cuda", [0, 1, 2], False, env)["ok"] is True  # one drafter per GPU: exclusive is fine
    no_smi = dict(env, PATH=str(tmp_path / "drv"))
    pf = gc.preflight("cuda", [0, 0, 0], True, no_smi)
    assert pf["compute_modes"] is None and "not checked" in pf["compute_mode_note"]


def test_preflight_needs_python_h(tmp_path, monkeypatch):
    gc = _gpu_check()
    assert gc.preflight("cpu", [], False, {})["ok"] is True  # this host builds Inductor's C++: it has Python.h
    monkeypatch.setattr(gc.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    pf = gc.preflight("cpu", [], False, {})
    assert pf["ok"] is False and pf["python_h"] is None
    assert f"no Python.h in {tmp_path}" in pf["problems"][0] and "-dev" in pf["problems"][0]


def _summary(bypass):
    procs = []
    for i, role in enumerate(["lead", "reuse", "reuse"]):
        m = dict(gate_role=role, device="cuda:0", attention="flex", compile_wall_s=5.0, fxgraph_cache_hit=0 if i == 0 else 3,
                 fxgraph_cache_miss=3 if i == 0 else 0, fxgraph_cache_bypass=bypass if i else 0)
        procs.append({"name": f"drafter:{i}", "device": "cuda:0", "exit_code": 0, "state": "EXITED", "metrics": m})
    return {"processes": procs}


def test_a_bypassed_fx_graph_fails_check_a(tmp_path, monkeypatch):
    gc = _gpu_check()
    seen = {}

    def fake_run(launcher, config, run_id, log_dir, timeout_s, env):
        seen["config"], seen["timeout"] = open(config).read(), timeout_s
        return {"exit_code": 0, "timed_out": False, "wall_s": 1.0, "console": "c", "run_dir": "r",
                "summary": _summary(seen["bypass"])}

    monkeypatch.setattr(gc, "run_launcher", fake_run)
    timeouts = {"gate": 1111, "ready": 2222, "run": 3333}
    for bypass, ok in ((0, True), (1, False)):
        seen["bypass"] = bypass
        work = tmp_path / f"w{bypass}"
        work.mkdir()
        out = gc.drafter_run("cuda", "dflash-launch", str(work), "gated", True, 1, 2, timeouts)
        assert out["ok"] is ok, out
        assert out["reused_with_0_misses"] == 2  # hits alone would have passed it
    assert out["bypassed"] == {"drafter:1": 1, "drafter:2": 1} and "since torch 2.10" in out["error"]
    # the three timeouts go where they belong: the gate's, the readiness', the whole run's
    assert 'timeout = "1111s"' in seen["config"] and 'timeout = "2222s"' in seen["config"]
    assert seen["timeout"] == 3333


def test_timeout_flags(tmp_path):
    gc = _gpu_check()
    a = gc.parse_args([])
    assert (a.gate_timeout, a.ready_timeout, a.run_timeout) == (1200, 1200, 2700)  # room for a cold flex compile
    a = gc.parse_args(["--gate-timeout", "60", "--ready-timeout", "90"])
    assert (a.gate_timeout, a.ready_timeout, a.run_timeout) == (60, 90, 450)
    a = gc.parse_args(["--timeout", "600"])  # the old flag: all three
    assert (a.gate_timeout, a.ready_timeout, a.run_timeout) == (600, 600, 660)
    with pytest.raises(SystemExit):
        gc.parse_args(["--gate-timeout", "0"])


def test_a_failed_preflight_stops_before_any_run(bin_dir, tmp_path, monkeypatch):
    gc = _gpu_check()
    env, drv = _host(tmp_path, libcuda_so=False, modes=["Exclusive_Process"])
    monkeypatch.setenv("PATH", env["PATH"] + ":" + os.environ["PATH"])
    monkeypatch.setattr(gc, "torch_info", lambda: {"version": torch.__version__, "cuda": "13.0", "cuda_available": True,
                                                   "gpus": [{"index": 0, "name": "NVIDIA H200"}], "triton": "3.6.0"})
    monkeypatch.setattr(gc, "run_launcher", lambda *a: pytest.fail("a run started despite the failed preflight"))
    out = tmp_path / "check"
    assert gc.main(["--out", str(out), "--launcher", str(bin_dir / "dflash-launch")]) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] is False and report["mode"] == "cuda" and list(report["checks"]) == ["preflight"]
    assert len(report["checks"]["preflight"]["problems"]) == 2
    text = (out / "summary.txt").read_text()
    assert text.startswith("dflash gpu-check (cuda): FAIL") and "preflight   FAIL" in text and "-c DEFAULT" in text


def test_check_e_runs_the_shipped_config_scaled_to_the_gpus(tmp_path, monkeypatch):
    """--pipeline CONFIG: check (e) hands the shipped config to pipeline_twin with this machine's mode and GPU
    count and the run timeout, and its verdict reaches the summary and the exit code (the twin itself runs in
    tests/test_dflash_8gpu.py)."""
    gc = _gpu_check()
    from dflash_launch.roles import pipeline_twin
    pytest.importorskip("transformers")
    seen = {}

    def fake_twin(shipped, work, launcher, mode, n_gpus, timeout_s, env):
        seen.update(shipped=shipped, work=work, mode=mode, n_gpus=n_gpus, timeout=timeout_s,
                    pythonpath=env["PYTHONPATH"])
        # the config's `python` is the check's own Python, whatever PATH had
        assert env["PATH"].split(os.pathsep)[0] == os.path.join(work, "bin")
        py = subprocess.run([os.path.join(work, "bin", "python"), "-c", "import sys, torch; print(sys.prefix)"],
                            capture_output=True, text=True)
        assert py.returncode == 0 and py.stdout.strip() == sys.prefix, py.stderr  # this venv, with its torch
        return {"ok": seen["ok"], "drafter_steps": [37, 37, 37], "frames": 110, "exactly_once": seen["ok"],
                "losses": {}}

    monkeypatch.setattr(pipeline_twin, "run_twin", fake_twin)
    for ok in (True, False):
        seen["ok"] = ok
        r = pipeline_twin.gpu_check("/cfg/dflash-8gpu.toml", "cuda", 1, "dflash-launch", str(tmp_path), 4321)
        assert r["ok"] is ok and "5 targets on [0, 0, 0, 0, 0], the DDP drafters on [0]" in r["note"], r
        line = pipeline_twin.summary_line(r)
        assert line.startswith("  (e) pipeline " + ("ok  " if ok else "FAIL"))
    assert seen == dict(shipped="/cfg/dflash-8gpu.toml", work=str(tmp_path / "pipeline"), mode="cuda", n_gpus=1,
                        timeout=4321, pythonpath=str(ROOT / "python"), ok=False)
    report = {"checks": {"preflight": {"ok": True, "problems": []}, "gated": {"ok": True, "processes": [], "compile_s": [],
              "leads": 1, "reused_with_0_misses": 2}, "shape_contract": {"ok": True, "shape": [1], "device": "cpu",
              "accepted": True, "stacked_rejected": True, "one_tap_rejected": True, "launcher_accepts": True,
              "launcher_rejects_stacked": True}, "ungated": {"ok": True, "compile_s": []}, "pipeline": r},
              "report": str(tmp_path / "report.json"), "mode": "cuda", "ok": None,
              "dflash_launch": {"version": "v"}, "torch": {"version": "t", "cuda": "c", "gpus": []}}
    assert gc.finish(report, str(tmp_path), 0) == 1 and report["ok"] is False  # a failed (e) fails the check
    assert "(e) pipeline FAIL" in (tmp_path / "summary.txt").read_text()
    assert gc.parse_args(["--pipeline", "x.toml"]).pipeline == "x.toml" and gc.parse_args([]).pipeline == ""


@pytest.mark.parametrize("layout", ["bundle", "checkout"])
def test_the_script_passes_the_8gpu_config_it_finds(tmp_path, layout):
    """scripts/gpu-check adds --pipeline <the 8-GPU config> beside it (the bundle) or in ../configs (a checkout);
    a fake PYTHON records what it is asked to run."""
    import shutil
    root = tmp_path / layout
    here = root if layout == "bundle" else root / "scripts"
    wheel_dir = root if layout == "bundle" else root / "dist"
    config = root / "dflash-8gpu.toml" if layout == "bundle" else root / "configs" / "dflash-8gpu.toml"
    for d in (here, wheel_dir, config.parent):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "scripts" / "gpu-check", here / "gpu-check")
    shutil.copy(ROOT / "configs" / "dflash-8gpu.toml", config)
    (wheel_dir / "dflash_launch-0.1.0-py3-none-any.whl").write_text("")
    log = tmp_path / "argv.log"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit 0\n")
    fake.chmod(0o755)
    r = run([here / "gpu-check", tmp_path / "out", "--steps", "1"], env=dict(os.environ, PYTHON=str(fake)))
    assert r.returncode == 0, r.stderr
    last = log.read_text().splitlines()[-1]
    assert last == f"-m dflash_launch.tools.gpu_check --out {tmp_path / 'out' / 'check'} --pipeline {config} --steps 1"
    config.unlink()  # no config: no (e)
    r = run([here / "gpu-check", tmp_path / "out2"], env=dict(os.environ, PYTHON=str(fake)))
    assert log.read_text().splitlines()[-1] == f"-m dflash_launch.tools.gpu_check --out {tmp_path / 'out2' / 'check'}"

"""`python -m dflash_launch.gpu_check` in its CPU mode (no GPU here): it must notice there is none and still run
(a) the gated drafters, (c) the shape contract and (d) the ungated drafters, and report them field by field.
And the reference drafter's flex_attention path (what the check compiles on CUDA) masks exactly like SDPA's
dense mask."""
import json
import os
import sys

import pytest
import torch

from conftest import ROOT, run

ENV = dict(os.environ, PYTHONPATH=f"{ROOT / 'python'}:{os.environ.get('PYTHONPATH', '')}")


def test_flex_block_mask_is_the_dense_mask():
    sys.path.insert(0, str(ROOT / "python"))
    from dflash_launch.reference_drafter import build, pick_attention
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="this test is the no-GPU mode; docs/gpu.md runs the GPU one")
def test_cpu_mode_reports_every_check(bin_dir, tmp_path):
    out = tmp_path / "check"
    r = run([sys.executable, "-m", "dflash_launch.gpu_check", "--out", out, "--launcher", bin_dir / "dflash-launch",
             "--steps", "2", "--timeout", "600"], env=ENV, timeout=1500)
    report = json.loads((out / "report.json").read_text())
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["format"] == "dflash-gpu-check/1"
    assert report["mode"] == "cpu" and report["ok"] is True
    assert report["torch"]["version"] == torch.__version__ and report["torch"]["cuda_available"] is False
    assert report["torch"]["gpus"] == []
    assert report["dflash_launch"]["version"] == "dflash-launch 0.1.0"
    assert "tested with torch" in report["dflash_launch"]["version_full"]
    assert report["dflash_launch"]["package"] == str(ROOT / "python" / "dflash_launch")
    c = report["checks"]

    g = c["gated"]  # (a)
    assert g["ok"] and g["exit_code"] == 0 and not g["timed_out"] and g["gated"] is True
    assert g["leads"] == 1 and g["reused"] == 2 and g["reused_with_0_misses"] == 2
    assert len(g["processes"]) == 3 and len(g["compile_s"]) == 3
    lead = next(p for p in g["processes"] if p["gate_role"] == "lead")
    assert lead["fxgraph_cache_miss"] > 0  # the lead compiled: a fresh cache
    for p in g["processes"]:
        assert p["exit_code"] == 0 and p["state"] == "EXITED", p
        assert p["device"] == "cpu" and p["attention"] == "sdpa" and p["cuda_visible_devices"] == ""
        assert p["compile_wall_s"] > 0 and p["steps"] == 2 and p["torch_version"] == torch.__version__
        if p["gate_role"] == "reuse":
            assert p["fxgraph_cache_miss"] == 0 and p["fxgraph_cache_hit"] > 0
    assert g["lead_compile_s"] == lead["compile_wall_s"] and len(g["reuse_compile_s"]) == 2

    x = c["cross_gpu"]  # (b)
    assert x == {"checked": False, "gpus": 0, "ok": None, "note": "no GPU: cross-GPU key sharing not checked"}

    s = c["shape_contract"]  # (c)
    assert s["shape"] == [1, 2000, 25600] and s["dtype"] == "bf16" and s["device"] == "cpu"
    for k in ("accepted", "stacked_rejected", "one_tap_rejected", "launcher_accepts", "launcher_rejects_stacked", "ok"):
        assert s[k] is True, (k, s)
    assert "x.reshape(1, 2000, 25600)" in s["stacked_message"]

    u = c["ungated"]  # (d)
    assert u["ok"] and u["exit_code"] == 0 and u["gated"] is False and len(u["compile_s"]) == 3
    for p in u["processes"]:
        assert p["gate_role"] == "" and p["exit_code"] == 0 and p["compile_wall_s"] > 0, p

    text = (out / "summary.txt").read_text()
    assert text.startswith("dflash gpu-check (cpu): PASS") and "(b) cross   -" in text and "no GPU" in text
    assert text in r.stdout


def test_refuses_a_used_out_dir_and_a_missing_launcher(bin_dir, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    r = run([sys.executable, "-m", "dflash_launch.gpu_check", "--out", used, "--launcher", bin_dir / "dflash-launch"],
            env=ENV)
    assert r.returncode == 64 and "not empty" in r.stderr
    assert [p.name for p in used.iterdir()] == ["keep.txt"] and (used / "keep.txt").read_text() == "mine"
    r = run([sys.executable, "-m", "dflash_launch.gpu_check", "--out", tmp_path / "o", "--launcher",
             tmp_path / "no-such-launcher"], env=ENV)
    assert r.returncode == 64 and "no dflash-launch" in r.stderr
    assert not (tmp_path / "o").exists()  # nothing made before the refusal

"""What `python -m dflash_launch.tools.gpu_check` reports in its CPU mode (no GPU here), field by field: it must
notice there is none and still run (a) the gated drafters, (c) the shape contract and (d) the ungated drafters.
Checked on the wheel's bundle by tests/test_wheel.py (`make test-wheel`, in CI) and, with DFLASH_LONG_TESTS=1,
on this checkout by tests/test_gpu_check.py."""
import torch


def check_cpu_report(report, stdout, summary_text, package, steps):
    assert report["format"] == "dflash-gpu-check/1"
    assert report["mode"] == "cpu" and report["ok"] is True
    assert report["torch"]["version"] == torch.__version__ and report["torch"]["cuda_available"] is False
    assert report["torch"]["gpus"] == []
    assert report["dflash_launch"]["version"] == "dflash-launch 0.1.0"
    assert "tested with torch" in report["dflash_launch"]["version_full"]
    assert report["dflash_launch"]["package"] == str(package)
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
        assert p["compile_wall_s"] > 0 and p["steps"] == steps and p["torch_version"] == torch.__version__
        if p["gate_role"] == "reuse":
            # It traced its own code and found every graph in the FX-graph cache (docs/cachelock.md, "What is exact")
            assert p["fxgraph_cache_miss"] == 0 and p["fxgraph_cache_hit"] > 0, p
    assert g["lead_compile_s"] == lead["compile_wall_s"] and len(g["reuse_compile_s"]) == 2

    x = c["cross_gpu"]  # (b)
    assert x == {"checked": False, "gpus": 0, "ok": None, "note": "no GPU: cross-GPU key sharing not checked"}

    s = c["shape_contract"]  # (c)
    assert s["shape"] == [1, 2000, 25600] and s["dtype"] == "bf16" and s["device"] == "cpu"
    for k in ("accepted", "stacked_rejected", "one_tap_rejected", "launcher_accepts", "launcher_rejects_stacked", "ok"):
        assert s[k] is True, (k, s)
    assert "x.reshape(1, 2000, 25600)" in s["stacked_message"]

    f = c["pinned_spool"]  # (f): the pinned-view path of the spool, on CPU: pageable views, equal values
    assert f["ok"] and f["equal"] and f["pinned"] is False and f["device"] == "cpu", f

    u = c["ungated"]  # (d)
    assert u["ok"] and u["exit_code"] == 0 and u["gated"] is False and len(u["compile_s"]) == 3
    for p in u["processes"]:
        assert p["gate_role"] == "" and p["exit_code"] == 0 and p["compile_wall_s"] > 0, p

    assert summary_text.startswith("dflash gpu-check (cpu): PASS")
    assert "(b) cross   -" in summary_text and "no GPU" in summary_text
    assert "(f) pinned  ok" in summary_text
    assert summary_text in stdout

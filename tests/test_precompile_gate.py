"""Dynamo's precompile behind the gate (issue #22), real torch.compile of a tiny step on CPU: the launcher sets
TORCH_CACHING_PRECOMPILE=1 for gated processes, the leader (or warm-up) saves the artifact (at the end of its
compile through the payload hook, and in notify_ready()), the followers load it, and summary.json's gate facts say
for each whether it was precompiled and why not. On by default where the role's Python loads the payload hook (this
venv: scripts/setup installs dflash_launch_hook.pth), off with gate.precompile = false or without the hook
(docs/cachelock.md)."""
import json
import os
import subprocess
import sys

import pytest

from supervise import write_config

pytest.importorskip("torch")

VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}")

STEP = '''
import json, os
import torch
import dflash_launch
from torch._dynamo.utils import counters
{pad}
def step(x, w):
    return torch.relu(x @ w).sum()
if os.environ.get("BREAK_SAVE") == "1":  # stands in for a torch whose save raises
    def boom(*a, **k):
        raise RuntimeError("forced save failure")
    torch.compiler.save_cache_artifacts = boom
compiled = torch.compile(step)
x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
compiled(x, w).backward()
m = {{k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}}
m["dynamo_cache_hit"] = int(counters["dynamo_cache"]["dynamo_cache_hit"])
with open(os.environ["DFLASH_METRICS_FILE"], "w") as f:
    json.dump(m, f)
dflash_launch.notify_ready()
'''


# A payload that knows nothing of dflash_launch: its own READY code (the notify socket, or a log line), a training
# step (the artifact is whole once the lazy backward compiled) or, with INFER=1, an inference one (once Dynamo
# recorded the frame).
PLAIN = '''
import json, os, socket
import torch
from torch._dynamo.utils import counters
def step(x, w):
    return torch.relu(x @ w).sum()
compiled = torch.compile(step)
x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
if os.environ.get("INFER") == "1":
    with torch.no_grad():
        compiled(x, w)
else:
    compiled(x, w).backward()
m = {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
m["dynamo_cache_hit"] = int(counters["dynamo_cache"]["dynamo_cache_hit"])
with open(os.environ["DFLASH_METRICS_FILE"], "w") as f:
    json.dump(m, f)
if os.environ.get("READY_BY") == "log":
    print("model ready", flush=True)
else:
    address = os.environ["NOTIFY_SOCKET"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"READY=1", "\\0" + address[1:] if address.startswith("@") else address)
'''


def config(tmp_path, n, gate, env="", pad="", script=None, ready=""):
    (tmp_path / "step.py").write_text(script or STEP.format(pad=pad))
    return write_config(tmp_path, f"""
        [[role]]
        name = "tiny"
        cpu = {n}
        command = ["python", "{tmp_path / 'step.py'}"]
        env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", OMP_NUM_THREADS = "1"{env} }}
        gate = {gate}
        {ready}
        """)


def facts(p):
    g = p["gate"] or {}
    return g.get("precompiled"), g.get("precompile")


def traced_with_the_fx_cache(p):
    m = p["metrics"]
    return p["exit_code"] == 0 and m.get("fxgraph_cache_hit", 0) > 0 and m.get("fxgraph_cache_miss", 0) == 0


def test_followers_load_the_warmups_artifact_and_an_edited_script_falls_back(launch, tmp_path):
    gate = '{ key = "tiny", timeout = "10m", precompile = true }'  # a fixed key: the edited script reuses its READY
    r = launch(config(tmp_path, 2, gate), env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    (warmup,) = s["warmups"]
    assert facts(warmup) == (True, "saved"), warmup["gate"]
    assert any((tmp_path / "cache" / "dynamo").iterdir())
    for p in s["processes"]:  # warm-up mode: no worker of their own, their notify_ready() says it
        assert p["gate"]["role"] == "reuse" and facts(p) == (True, "dynamo cache hit"), p["gate"]
        assert p["gate"]["dynamo_hits"] >= 1 and p["metrics"]["dynamo_cache_hit"] >= 1, p
        # Loaded, not traced: no FX-graph lookups at all.
        assert not any(k.startswith("fxgraph_cache") and v for k, v in p["metrics"].items()), p["metrics"]
    assert s["warnings"] == []

    # The same key, but `step` one line down: Dynamo's key (qualname + first line) misses, today's path.
    r = launch(config(tmp_path, 1, '{ key = "tiny", timeout = "10m", mode = "serial", precompile = true }',
                      pad="x_unused = 1\n"),
               run_id="edited", env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    (p,) = r.summary()["processes"]
    precompiled, why = facts(p)
    assert p["gate"]["role"] == "reuse" and precompiled is False and why.startswith("dynamo cache miss"), p["gate"]
    assert traced_with_the_fx_cache(p), p
    assert "not precompiled (dynamo cache miss" in (tmp_path / p["log"]["stderr"]).read_text()


def test_precompile_is_off_when_the_gate_says_false(launch, tmp_path):
    r = launch(config(tmp_path, 2, '{ timeout = "10m", mode = "serial", precompile = false }'), env=ENV)
    assert r.wait(timeout=600) == 0, r.err
    procs = r.summary()["processes"]
    assert sorted(p["gate"]["role"] for p in procs) == ["lead", "reuse"]
    for p in procs:
        assert facts(p) == (False, "off (gate.precompile = false)"), p["gate"]
    (follower,) = [p for p in procs if p["gate"]["role"] == "reuse"]
    assert traced_with_the_fx_cache(follower), follower
    d = tmp_path / "cache" / "dynamo"
    assert not d.exists() or not any(d.iterdir())


@pytest.mark.parametrize("ready_by,infer,mode", [("socket", "0", "serial"), ("log", "1", "warmup")])
def test_a_script_that_never_imports_dflash_launch_leads_and_its_followers_load(launch, tmp_path, ready_by, infer,
                                                                                mode):
    """gate = true and nothing else, a script with its own READY: the payload hook saves the leader's (or the
    warm-up's) artifact inside its first step (before its READY, however it says it) and reports every process's
    facts. Serial with a training step and a socket READY; warm-up mode with an inference step and a log line."""
    ready = 'ready = { mode = "log", pattern = "^model ready$" }' if ready_by == "log" else ""
    cfg = config(tmp_path, 2, f'{{ timeout = "10m", mode = "{mode}" }}',
                 env=f', READY_BY = "{ready_by}", INFER = "{infer}"', script=PLAIN, ready=ready)
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    leader = s["warmups"][0] if mode == "warmup" else next(p for p in s["processes"] if p["gate"]["role"] == "lead")
    followers = [p for p in s["processes"] if p is not leader]
    assert leader["gate"]["role"] == "lead" and facts(leader) == (True, "saved"), leader["gate"]
    assert leader["metrics"]["fxgraph_cache_miss"] == (1 if infer == "1" else 2), leader["metrics"]
    assert len(followers) == (2 if mode == "warmup" else 1)
    for p in followers:
        assert p["gate"]["role"] == "reuse" and facts(p) == (True, "dynamo cache hit"), p["gate"]
        m = p["metrics"]
        assert m["dynamo_cache_hit"] == 1 and not any(k.startswith("fxgraph_cache") and v for k, v in m.items()), m
    if mode == "serial":  # dflash-worker's line; a warm-up-mode process has no worker, its facts go as they are
        assert "precompile loaded (dynamo cache hit)" in (tmp_path / followers[0]["log"]["stderr"]).read_text()


def plan_role(bin_dir, cfg, env=None):
    """The tiny role as `check --json` plans it."""
    out = subprocess.run([str(bin_dir / "dflash-launch"), "check", "--json", str(cfg)], env=env or ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (role,) = json.loads(out.stdout)["roles"]
    return role["gate"]


def test_precompile_defaults_to_on_only_where_the_hook_loads(bin_dir, tmp_path):
    gate = '{ timeout = "10m", mode = "serial" }'
    on = plan_role(bin_dir, config(tmp_path, 2, gate, script=PLAIN))
    assert on["precompile"] is True and "loads dflash-launch's payload hook" in on["precompile_why"], on
    # The hook's opt-out, in the role's env: the probe sees what the processes will.
    off = plan_role(bin_dir, config(tmp_path, 2, gate, env=', DFLASH_PAYLOAD_HOOK = "0"', script=PLAIN))
    assert off["precompile"] is False and "does not load dflash-launch's payload hook" in off["precompile_why"], off
    assert off["key"] != on["key"]  # another Dynamo config: another READY
    # A Python without dflash-launch: a venv of its own (no torch either; only the plan is asked).
    import venv
    venv.create(tmp_path / "bare", with_pip=False)
    bare = dict(ENV, PATH=f"{tmp_path / 'bare' / 'bin'}:{os.environ['PATH']}")
    assert plan_role(bin_dir, config(tmp_path, 2, gate, script=PLAIN), env=bare)["precompile"] is False
    # Asked for where the hook does not load, precompile is a config error (issue #37): the hook is what checks that
    # a loaded entry is exact for its process. gate.precompile = true, or torch's own variable in the role's env.
    for where, gate_, env_, python in (
            ("gate.precompile", '{ timeout = "10m", precompile = true }', "", bare),
            ("env.TORCH_CACHING_PRECOMPILE", gate, ', TORCH_CACHING_PRECOMPILE = "1", DFLASH_PAYLOAD_HOOK = "0"', ENV)):
        cfg = config(tmp_path, 2, gate_, env=env_, script=PLAIN)
        out = subprocess.run([str(bin_dir / "dflash-launch"), "check", str(cfg)], env=python,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stdout == "", out
        assert "run.toml:" in out.stderr and f"role[tiny].{where}: Dynamo's precompile needs dflash-launch's payload " \
            "hook" in out.stderr and "install dflash-launch into the role's Python" in out.stderr, out.stderr


def test_a_failed_save_is_in_the_summary_and_the_follower_traces(launch, tmp_path):
    r = launch(config(tmp_path, 2, '{ timeout = "10m", mode = "serial", precompile = true }', env=', BREAK_SAVE = "1"'),
               env=ENV)
    assert r.wait(timeout=600) == 0, r.err
    procs = {p["gate"]["role"]: p for p in r.summary()["processes"]}
    assert facts(procs["lead"]) == (False, "save failed: RuntimeError: forced save failure"), procs["lead"]["gate"]
    assert procs["lead"]["gate"]["state"] == "ready"  # READY still published: the FX-graph cache is warm
    assert facts(procs["reuse"]) == (False, "no artifact: leader did not save"), procs["reuse"]["gate"]
    assert traced_with_the_fx_cache(procs["reuse"]), procs["reuse"]
    assert "precompile artifact not saved (RuntimeError: forced save failure)" in (
        tmp_path / procs["lead"]["log"]["stderr"]).read_text()

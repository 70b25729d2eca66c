"""notify_ready() saves Dynamo's precompile artifact for a gate's leader (real torch.compile, one process
each, one shared TORCHINDUCTOR_CACHE_DIR): a fresh follower then loads instead of tracing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent

SCRIPT = '''
import json, os, sys
import torch
import dflash_launch
from torch._dynamo.utils import counters
{pad}
def step(x, w):
    return torch.relu(x @ w).sum()
{fail}
compiled = torch.compile(step)
x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
compiled(x, w).backward()
dflash_launch.notify_ready()
out = {{k: dict(v) for k, v in counters.items() if k in ("dynamo_cache", "inductor")}}
facts = dflash_launch.precompile_facts() if dflash_launch.gate_role() == "reuse" else None  # a leader would save again
print(json.dumps(dict(out, facts=facts)))
'''


def run(tmp_path, role, pad="", fail=""):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(pad=pad, fail=fail))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCH_CACHING_PRECOMPILE="1",
               DFLASH_GATE_ROLE=role, PYTHONPATH=str(REPO / "python"))
    env.pop("NOTIFY_SOCKET", None)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_a_follower_loads_the_leaders_precompile_and_does_not_trace(tmp_path):
    _, err = run(tmp_path, "lead")
    assert "not saved" not in err, err
    assert any((tmp_path / "cache" / "dynamo").iterdir()), "the leader wrote no dynamo entry"
    c, _ = run(tmp_path, "reuse")
    assert c.get("dynamo_cache", {}).get("dynamo_cache_hit") == 1, c
    # Nothing traced, so no FX-graph lookups at all (hit or miss).
    assert not any(k.startswith("fxgraph_cache") for k in c.get("inductor", {})), c


def test_an_edited_script_misses_the_precompile_and_falls_back(tmp_path):
    run(tmp_path, "lead")
    c, _ = run(tmp_path, "reuse", pad="x_unused = 1\n")  # `step` moves a line: the key changes
    assert not c.get("dynamo_cache", {}).get("dynamo_cache_hit"), c
    assert c.get("inductor", {}).get("fxgraph_cache_hit", 0) >= 1, c  # today's path: the FX-graph cache


def test_a_failing_save_says_why_and_the_follower_traces(tmp_path):
    fail = ("def boom(*a, **k):\n    raise RuntimeError('forced save failure')\n"
            "torch.compiler.save_cache_artifacts = boom")
    _, err = run(tmp_path, "lead", fail=fail)
    assert "precompile artifact not saved (RuntimeError: forced save failure)" in err, err
    c, _ = run(tmp_path, "reuse")
    assert not c.get("dynamo_cache", {}).get("dynamo_cache_hit"), c
    assert c.get("inductor", {}).get("fxgraph_cache_hit", 0) >= 1, c


def test_a_follower_does_not_save(tmp_path):
    run(tmp_path, "reuse")
    d = tmp_path / "cache" / "dynamo"
    assert not d.exists() or not any(d.iterdir())


def _follower_with_other_threads(tmp_path, **extra_env):
    """A leader with one thread saves; a follower with two loads its entry, whose GLOBAL_STATE guard then fails."""
    run(tmp_path, "lead", pad="torch.set_num_threads(1)")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(pad="torch.set_num_threads(2)", fail=""))  # `step` stays on its line
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCH_CACHING_PRECOMPILE="1",
               DFLASH_GATE_ROLE="reuse", PYTHONPATH=str(REPO / "python"), **extra_env)
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(os.environ.get("DFLASH_LONG_TESTS") != "1",
                    reason="a canary of torch's own bug, for when the torch pin moves: DFLASH_LONG_TESTS=1")
def test_torch_2_13_crashes_a_follower_whose_loaded_entry_fails_a_guard(tmp_path):
    """torch alone (the helper's fix off): the entry loads (same qualname and first line), its GLOBAL_STATE guard
    fails (another thread count), and the re-trace dies on the globals the load installed instead of falling back.
    When this fails, torch fixed it: dflash_launch/retrace_fix.py can go (docs/cachelock.md)."""
    p = _follower_with_other_threads(tmp_path, DFLASH_RETRACE_FIX="0")
    assert p.returncode != 0 and "already exists in scope" in p.stderr, (p.returncode, p.stderr[-2000:])


def test_a_follower_whose_loaded_entry_fails_a_guard_retraces_and_says_so(tmp_path):
    """With the helper imported (retrace_fix), the same follower re-traces, finishes its step, and its facts say
    it did not run on the artifact: never reported as precompiled."""
    p = _follower_with_other_threads(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "already exists in scope" not in p.stderr
    c = json.loads(p.stdout.strip().splitlines()[-1])
    assert c.get("dynamo_cache", {}).get("dynamo_cache_hit") == 1, c  # it did load the entry
    facts = c["facts"]
    assert facts[0] is False, facts
    assert facts[1].startswith("dynamo cache hit, but its guards failed in this process"), facts
    assert facts[1].endswith("re-traced with the FX-graph cache"), facts


def test_a_leader_whose_loaded_entry_fails_a_guard_retraces_and_saves_what_it_compiled(tmp_path):
    """A stale entry (an earlier run's, here with one thread) that a *leader* loads and whose guard then fails:
    the leader re-traces instead of crashing, and saves what it compiled, so a follower like it loads that and
    runs on the artifact."""
    run(tmp_path, "lead", pad="torch.set_num_threads(1)")
    _, err = run(tmp_path, "lead", pad="torch.set_num_threads(2)")  # `step` stays on its line: the same key
    assert "already exists in scope" not in err and "not saved" not in err, err
    c, _ = run(tmp_path, "reuse", pad="torch.set_num_threads(2)")
    assert c.get("dynamo_cache", {}).get("dynamo_cache_hit") == 1, c
    assert c["facts"][0] is True, c["facts"]

"""The compile gate for roles whose processes train together (issue #10), on
real torch.compile and real torch.distributed (gloo): gate mode "warmup", the
honest READY, the key that follows the code, one compile at a time."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, run
from supervise import reused_without_compiling, wait_until, write_config

VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "python"))
DDP = ROOT / "tests" / "payloads" / "ddp_step.py"
PY = sys.executable


def ddp_role(n=3, gate="true", port=0, extra=""):
    return f"""
[[role]]
name = "drafter"
cpu = {n}
command = ["{PY}", "{DDP}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", DDP_STEPS = "2" }}
gate = {gate}
ready = {{ mode = "notify", timeout = "10m" }}
{extra}
"""


def test_ddp_role_gated_compiles_once_and_targets_do_not_wait(launch, tmp_path):
    """An unmodified DDP script, `gate = true`: no deadlock; the warm-up is the
    only compile of the run; every rank hits the cache; the all_reduce spans the
    role's world (of 2: the count is not what is tested)."""
    target = """
[[role]]
name = "target"
cpu = 1
command = ["sh", "-c", "echo loading; sleep 2"]
"""
    cfg = write_config(tmp_path, target + ddp_role(n=2))
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    (warm,) = s["warmups"]
    assert warm["name"] == "drafter:warmup" and warm["gate"]["role"] == "lead" and warm["gate"]["state"] == "ready"
    assert warm["metrics"]["fxgraph_cache_miss"] > 0 and warm["metrics"]["world"] == 1
    ranks = [p for p in s["processes"] if p["role"] == "drafter"]
    assert len(ranks) == 2
    for p in ranks:
        m = p["metrics"]
        assert reused_without_compiling(m), (p["name"], m)  # the warm-up's kernels
        assert m["world"] == 2 and m["all_reduce_sum"] == 3.0  # 1 + 2: one world of two
        assert p["gate"]["role"] == "reuse" and p["gate"]["mode"] == "warmup"
    assert s["warnings"] == []
    # The target started at once, while the warm-up compiled.
    log = (r.run_dir / "supervisor.log").read_text()
    assert log.index("target:0 STARTING") < log.index("drafter:warmup RUNNING -> EXITED")
    assert log.index("drafter:warmup RUNNING -> EXITED") < log.index("drafter:0 STARTING (pid")
    assert "drafter:warmup" in r.out  # in the console's table


def test_hold_one_holds_only_the_first_rank(launch, tmp_path):
    """gate hold = "one": ranks 1 and 2 start with the warm-up and wait in init_process_group
    for rank 0, which starts once the warm-up has compiled; nobody misses."""
    cfg = write_config(tmp_path, ddp_role(gate='{ hold = "one" }', extra='world = "role"'))
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    for p in s["processes"]:
        m = p["metrics"]
        assert reused_without_compiling(m), (p["name"], m)
        assert m["world"] == 3 and m["all_reduce_sum"] == 6.0
    log = (r.run_dir / "supervisor.log").read_text()
    warm_done = log.index("drafter:warmup RUNNING -> EXITED")
    assert log.index("drafter:1 STARTING (pid") < warm_done and log.index("drafter:2 STARTING (pid") < warm_done
    assert warm_done < log.index("drafter:0 STARTING (pid")


def test_ddp_role_ungated_every_rank_compiles(launch, tmp_path):
    """Two ranks (not 3), no gate: no warm-up, nobody held, each rank traces and looks its graphs up for itself, in
    one world (1 + 2). Both compile at once; a rank that a loaded machine starts its step seconds late may find the
    other's entry, which is the shared cache doing its job, so the misses are counted over the world."""
    cfg = write_config(tmp_path, ddp_role(n=2, gate="false"))
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    assert s["warmups"] == [] and len(s["processes"]) == 2
    for p in s["processes"]:
        m = p["metrics"]
        assert not p["gate"] and m["all_reduce_sum"] == 3.0, (p["name"], p["gate"])
        assert m["fxgraph_cache_miss"] + m["fxgraph_cache_hit"] > 0, (p["name"], m)  # traced for itself
    assert sum(p["metrics"]["fxgraph_cache_miss"] for p in s["processes"]) > 0


def test_serial_mode_on_a_process_group_is_caught_by_the_idle_hint(launch, tmp_path):
    """The old deadlock, asked for on purpose (mode = "serial"): the leader blocks
    in init_process_group; the waiter says why long before its timeout. The hint is
    the event waited for (the leader's `import torch` alone can take most of a short
    timeout on a cold, loaded machine), then the run is stopped."""
    role = ddp_role(n=2, gate='{ mode = "serial", timeout = "10m", idle_hint = "2s" }')
    r = launch(write_config(tmp_path, role), env=ENV)
    r.wait_for_log("it is not compiling, it is blocked", timeout=300)
    r.signal(signal.SIGTERM)
    assert r.wait(timeout=120) == 128 + signal.SIGTERM, r.out + r.err
    s = r.summary()
    hints = [w for w in s["warnings"] if "it is not compiling, it is blocked" in w]
    assert hints and 'use gate mode "warmup"' in hints[0], s["warnings"]


def shell_role(cmd, ready, n=1, gate='{ key = "k", mode = "serial" }'):
    return f"""
[[role]]
name = "p"
cpu = {n}
command = {json.dumps(cmd)}
cwd = "."
gate = {gate}
ready = {ready}
"""


def markers(tmp_path):
    d = tmp_path / "cache" / ".dflash" / "ready"
    return sorted(p.name for p in d.glob("*.json")) if d.exists() else []


@pytest.mark.parametrize("stream", ["stdout", "both"])
def test_log_readiness_a_crashing_leader_never_publishes(launch, tmp_path, stream):
    # Python echoes the offending source line -- pattern included -- in the
    # SyntaxError traceback on stderr, then exits 1.
    (tmp_path / "broken.py").write_text('print("compiled ok") )\n')
    ready = f'{{ mode = "log", pattern = "compiled ok", stream = "{stream}", timeout = "1m" }}'
    r = launch(write_config(tmp_path, shell_role([PY, "broken.py"], ready)), env=ENV)
    assert r.wait(timeout=60) == 1
    assert markers(tmp_path) == []
    s = r.summary()
    assert 'compiled ok' in (r.run_dir / "attempt_0/p-0.stderr.log").read_text()  # the echo was there
    if stream == "stdout":
        # stderr is not watched: never ready.
        assert any("ended before it was ready (exited with code 1)" in w for w in s["warnings"]), s["warnings"]
    else:
        # Asked to watch stderr too, the echo counts as ready -- and the
        # cache, untouched, does not back it: still no READY.
        assert any("left the cache as it was" in w or "ended before it was ready" in w for w in s["warnings"])


def test_log_readiness_sees_an_unflushed_print_at_once(launch, tmp_path):
    # print() without flush=True on a pipe: seen only because gated processes get PYTHONUNBUFFERED=1.
    code = ("import os, time; open(os.environ['TORCHINDUCTOR_CACHE_DIR'] + '/kernel', 'w').write('k'); "
            "print('compiled ok'); time.sleep(60)")
    ready = '{ mode = "log", pattern = "compiled ok", timeout = "1m" }'
    r = launch(write_config(tmp_path, shell_role([PY, "-c", code], ready)), env=ENV)
    r.wait_for_log("p:0 STARTING -> RUNNING", timeout=40)  # long before the payload's 60 s end
    assert markers(tmp_path) == ["k.json"]
    r.signal(signal.SIGTERM)
    r.wait(timeout=60)


def test_a_leader_that_never_says_ready_is_a_warning(launch, tmp_path):
    cmd = ["sh", "-c", "echo k > $TORCHINDUCTOR_CACHE_DIR/kernel.$DFLASH_PROCESS"]
    r = launch(write_config(tmp_path, shell_role(cmd, '"notify"', n=2)), env=ENV)
    assert r.wait(timeout=60) == 0
    s = r.summary()
    assert len([w for w in s["warnings"] if "ended before it was ready (exited with code 0)" in w]) == 2
    assert "warning:" in r.out
    assert markers(tmp_path) == []


def test_a_ready_leader_that_wrote_nothing_publishes_nothing(launch, tmp_path):
    # The payload runs on after READY=1 until the worker has judged it (its warning is in the
    # payload's stderr log): READY is handled while it runs, as for a real trainer, with no sleep.
    cmd = ["sh", "-c", f"{PY} -c 'from dflash_launch import notify_ready; notify_ready()'; "
           "while [ ! -e release ]; do sleep 0.01; done"]
    r = launch(write_config(tmp_path, shell_role(cmd, '"notify"')), env=ENV)
    stderr_log = r.run_dir / "attempt_0" / "p-0.stderr.log"
    assert wait_until(lambda: stderr_log.exists() and "left the cache as it was" in stderr_log.read_text())
    (tmp_path / "release").touch()
    assert r.wait(timeout=60) == 0
    assert markers(tmp_path) == []
    assert any("left the cache as it was" in w for w in r.summary()["warnings"])


def check_key(bin_dir, cfg):
    r = run([bin_dir / "dflash-launch", "check", cfg, "--json"], env=ENV)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    return plan["processes"][0]["gate_key"], plan["roles"][0]["gate"]


def test_editing_the_script_or_a_key_file_changes_the_key(bin_dir, tmp_path):
    (tmp_path / "train.py").write_text("print('v1')\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "layers.py").write_text("A = 1\n")
    role = f"""
[[role]]
name = "drafter"
cpu = 2
command = ["{PY}", "-u", "train.py", "--lr", "1e-4"]
cwd = "."
gate = {{ key_files = ["model/*.py", "missing/*.cfg"] }}
"""
    cfg = write_config(tmp_path, role)
    k1, gate = check_key(bin_dir, cfg)
    files = {f["why"]: f for f in gate["key_files"]}
    assert files["script train.py"]["path"] == str(tmp_path / "train.py")
    assert files["key_files model/*.py"]["path"] == str(tmp_path / "model" / "layers.py")
    assert files["key_files missing/*.cfg"]["note"] == "matches no file"
    (tmp_path / "train.py").write_text("print('v2')\n")
    k2, _ = check_key(bin_dir, cfg)
    (tmp_path / "model" / "layers.py").write_text("A = 2\n")
    k3, _ = check_key(bin_dir, cfg)
    assert len({k1, k2, k3}) == 3
    text = run([bin_dir / "dflash-launch", "check", cfg], env=ENV).stdout
    # One line for the hashed files (their hashes are --json's), one for each that could not be hashed.
    assert f"key files 2: script train.py ({tmp_path / 'train.py'}) and 1 more" in text
    assert "key file key_files missing/*.cfg: (matches no file)" in text


def test_a_module_run_with_dash_m_is_in_the_key(bin_dir, tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("print('v1')\n")
    role = f"""
[[role]]
name = "drafter"
cpu = 1
command = ["{PY}", "-m", "mypkg.train"]
cwd = "."
gate = true
"""
    cfg = write_config(tmp_path, role)
    k1, gate = check_key(bin_dir, cfg)
    assert gate["key_files"][0]["path"] == str(pkg / "train.py")
    (pkg / "train.py").write_text("print('v2')\n")
    assert check_key(bin_dir, cfg)[0] != k1
    # An installed module is found the way Python finds it.
    role2 = role.replace("mypkg.train", "dflash_launch.roles.reference_drafter")
    _, gate2 = check_key(bin_dir, write_config(tmp_path, role2))
    assert gate2["key_files"][0]["path"].endswith("dflash_launch/roles/reference_drafter.py")


def test_sigkill_of_a_leader_kills_its_whole_tree_before_the_next_leads(bin_dir, tmp_path):
    """Its payload's children -- one in its group, one that called setsid --
    would keep compiling; none may run when the next leader starts."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    leader_cmd = ("setsid sh -c 'echo $$ > esc.pid; exec sleep 1000' & "
                  "sh -c 'echo $$ > grp.pid; exec sleep 1000' & "
                  "wait")
    w1 = subprocess.Popen([bin_dir / "dflash-worker", "--name", "first", "--gate-dir", cache, "--gate-key", "k",
                           "--ready", "notify", "--", "sh", "-c", leader_cmd], cwd=tmp_path, env=ENV,
                          stderr=subprocess.PIPE, text=True)
    # A pid file exists as soon as the shell opens it: wait for the whole line, not the file.
    pid_files = [tmp_path / f for f in ("esc.pid", "grp.pid")]
    assert wait_until(lambda: all(f.exists() and f.read_text().endswith("\n") for f in pid_files))
    pids = [int(f.read_text()) for f in pid_files]
    w1.kill()
    w1.wait()
    # The next leader's payload looks, first thing, at what still runs.
    probe = ("import json, sys\n"
             "def alive(p):\n"
             "    try: return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
             "    except OSError: return False\n"
             f"json.dump([p for p in {pids} if alive(p)], open('seen.json', 'w'))\n"
             "open(__import__('os').environ['TORCHINDUCTOR_CACHE_DIR'] + '/kernel', 'w').write('k')\n")
    env = dict(ENV, TORCHINDUCTOR_CACHE_DIR=str(cache))
    r = run([bin_dir / "dflash-worker", "--name", "second", "--gate-dir", cache, "--gate-key", "k", "--ready", "exit",
             "--", PY, "-c", probe], cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "lead, compiling" in r.stderr
    assert json.loads((tmp_path / "seen.json").read_text()) == []
    assert "killed 2 leftover process(es) of the dead leader first" in r.stderr
    for p in pids:  # and they stay gone
        with pytest.raises(OSError):
            st = open(f"/proc/{p}/stat").read()
            if st.rsplit(")", 1)[1].split()[0] == "Z":
                raise OSError("zombie")


@pytest.mark.parametrize("fake", [True, False])
def test_collectives_inside_the_graph_need_the_real_world_size(launch, tmp_path, fake):
    """all_gather in the graph puts the world size in its shapes: a warm-up in a
    world of one leaves the real ranks missing (and the gate says so); in the
    fake group of the real size, they hit."""
    role = f"""
[[role]]
name = "drafter"
cpu = 2
command = ["{PY}", "{ROOT / 'tests' / 'payloads' / 'gather_step.py'}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", FAKE_WORLD = "{1 if fake else 0}" }}
gate = true
"""
    r = launch(write_config(tmp_path, role), env=ENV)
    assert r.wait(timeout=600) == 0, r.out + r.err
    s = r.summary()
    (warm,) = s["warmups"]
    assert warm["metrics"]["world"] == (2 if fake else 1) and warm["metrics"]["fxgraph_cache_miss"] > 0
    for p in s["processes"]:
        m = p["metrics"]
        if fake:
            assert m["fxgraph_cache_miss"] == 0 and m["fxgraph_cache_hit"] > 0, (p["name"], m)
        else:  # the warm-up's graph serves no rank; the ranks trace together, and one may hit the other's fresh entry
            assert m["fxgraph_cache_miss"] + m["fxgraph_cache_hit"] > 0, (p["name"], m)
    if not fake:
        assert sum(p["metrics"]["fxgraph_cache_miss"] for p in s["processes"]) > 0, s["processes"]
    # A reuse that still compiled is never silent.
    assert (s["warnings"] == []) == fake, s["warnings"]

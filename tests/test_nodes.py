"""Runs that never meet by accident, and runs that span nodes (docs/multinode.md):
master_port = "auto", the run id lock, busy ports, node placement and global
ranks with real gloo worlds, and the scheduler's env (Slurm with a fake scontrol,
Kubernetes)."""
import json
import os
import socket
import subprocess
import textwrap

import pytest

from conftest import ROOT, run
from supervise import EVENT_TIMEOUT, wait_until, write_config

PY = ROOT / ".venv" / "bin" / "python"
GLOO = ROOT / "tests" / "payloads" / "gloo_world.py"


def gloo_roles(out, per_role=2, extra_b=""):
    cmd = json.dumps([str(PY), str(GLOO), str(out)])
    return f"""
        [[role]]
        name = "a"
        cpu = {per_role}
        command = {cmd}

        [[role]]
        name = "b"
        cpu = {per_role}
        command = {cmd}
        {extra_b}
        """


def results(out, run_id):
    return {d["rank"]: d for d in (json.loads(p.read_text()) for p in out.glob(f"{run_id}.*.json"))}


def start(bin_dir, config, run_id, *args, env=None):
    return subprocess.Popen([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", run_id,
                             "--color", "never", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def finish(p, timeout=180):
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    return p.returncode, out, err


def test_two_runs_at_once_with_default_settings_each_in_its_own_world(bin_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, gloo_roles(out))
    a, b = start(bin_dir, config, "one"), start(bin_dir, config, "two")
    (rc_a, _, err_a), (rc_b, _, err_b) = finish(a), finish(b)
    assert rc_a == 0, err_a
    assert rc_b == 0, err_b
    ports = {}
    for run_id in ("one", "two"):
        res = results(out, run_id)
        assert sorted(res) == [0, 1, 2, 3]
        for r in res.values():
            assert r["world"] == 4 and r["sum"] == 10.0  # 1+2+3+4: nobody from the other run joined
            assert r["role_peers"] == [run_id, run_id]    # the role worlds did not meet either
            assert r["omp"] == "1"                         # several processes on the host: torchrun's default
            assert r["local_world_size"] == 4 and r["local_rank"] == 0
        ports[run_id] = {res[0]["master_port"], res[0]["role_master_port"], res[2]["role_master_port"]}
        assert len(ports[run_id]) == 3  # MASTER_PORT and one port per role world, all distinct
    assert not ports["one"] & ports["two"]


def sleeper_config(tmp_path, extra_run=""):
    """One process that records its start (started.<run id>) and sleeps."""
    path = write_config(tmp_path, f"""
        [[role]]
        name = "s"
        cpu = 1
        command = ["sh", "-c", "touch {tmp_path}/started.$DFLASH_RUN_ID; exec sleep 600"]
        """)
    path.write_text(path.read_text().replace('log_dir = "runs"\n', f'log_dir = "runs"\n{extra_run}\n', 1))
    return path


def wait_for(path, proc, timeout=EVENT_TIMEOUT):
    """Until `path` exists; fails at once if `proc` ends first."""
    def there():
        assert proc.poll() is None or path.exists(), proc.communicate()
        return path.exists()
    assert wait_until(there, timeout), f"{path} did not appear"


def test_same_run_id_twice_second_fails_at_once_naming_the_holder(bin_dir, tmp_path):
    config = sleeper_config(tmp_path)
    first = start(bin_dir, config, "same")
    try:
        wait_for(tmp_path / "started.same", first)
        # Its payload starts before its supervisor logs it running: the snapshot is taken after that last line.
        first_log = tmp_path / "runs/same/supervisor.log"
        running = wait_until(lambda: "processes are running" in first_log.read_text(), EVENT_TIMEOUT)
        assert running, first_log.read_text()
        log_before = first_log.read_text()
        # The first sleeps 600 s: the second returning at all proves it did not wait for it.
        r = run([bin_dir / "dflash-launch", "run", config, "--run-id", "same"], timeout=60)
        assert r.returncode == 69, r.stderr
        assert "run id same is in use" in r.stderr and f"pid {first.pid}" in r.stderr
        assert (tmp_path / "runs/same/supervisor.log").read_text() == log_before  # it wrote nothing there
        assert not (tmp_path / "runs/same/summary.json").exists()
        assert first.poll() is None
    finally:
        os.killpg(first.pid, 15)
        finish(first)
    assert json.loads((tmp_path / "runs/same/summary.json").read_text())["processes"]


def test_busy_explicit_port_is_an_error_and_nothing_is_spawned(bin_dir, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        config = sleeper_config(tmp_path, extra_run=f"master_port = {port}")
        r = run([bin_dir / "dflash-launch", "run", config, "--run-id", "busy"], timeout=60)
        assert r.returncode == 69, r.stderr
        assert f"MASTER_PORT: port {port} is in use" in r.stderr and "nothing was started" in r.stderr
        assert not list(tmp_path.glob("started.*"))
        assert not (tmp_path / "runs/busy/supervisor.log").exists()
    finally:
        listener.close()


def test_busy_role_port_is_named(bin_dir, tmp_path):
    # master_port = P gives role "s" (index 0) ROLE_MASTER_PORT = P + 1: take that one.
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1] - 1
    try:
        config = sleeper_config(tmp_path, extra_run=f"master_port = {port}")
        r = run([bin_dir / "dflash-launch", "run", config, "--run-id", "busy"], timeout=60)
        assert r.returncode == 69, r.stderr
        assert f"ROLE_MASTER_PORT of role s: port {port + 1} is in use" in r.stderr
        assert not list(tmp_path.glob("started.*"))
    finally:
        listener.close()


def test_explicit_port_held_by_another_launcher_is_refused_naming_it(bin_dir, tmp_path):
    # Not yet bound by anyone (the payload is a sleep): only the port lock says it is taken.
    probe = socket.socket()
    probe.bind(("0.0.0.0", 0))
    port = probe.getsockname()[1]
    probe.close()
    config = sleeper_config(tmp_path, extra_run=f"master_port = {port}")
    first = start(bin_dir, config, "holder")
    try:
        wait_for(tmp_path / "started.holder", first)
        r = run([bin_dir / "dflash-launch", "run", config, "--run-id", "other"], timeout=60)
        assert r.returncode == 69, r.stderr
        assert f"port {port} is reserved by dflash-launch pid {first.pid}" in r.stderr
        assert "run holder" in r.stderr
        assert not (tmp_path / "started.other").exists()
    finally:
        os.killpg(first.pid, 15)
        finish(first)


def test_two_node_launchers_on_one_host_all_reduce_over_8_ranks(bin_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, gloo_roles(out))
    nodes = [start(bin_dir, config, "mn", "--nnodes", "2", "--node-rank", str(r), "--master-addr", "127.0.0.1")
             for r in (0, 1)]
    for p in nodes:
        rc, _, err = finish(p)
        assert rc == 0, err
    res = results(out, "mn")
    assert sorted(res) == list(range(8))
    expect = {  # rank -> (node, role, role rank): node by node, then role by role
        0: (0, "a", 0), 1: (0, "a", 1), 2: (0, "b", 0), 3: (0, "b", 1),
        4: (1, "a", 2), 5: (1, "a", 3), 6: (1, "b", 2), 7: (1, "b", 3)}
    for rank, r in res.items():
        assert (r["node_rank"], r["role"], r["role_rank"]) == expect[rank]
        assert r["world"] == 8 and r["sum"] == 36.0 and r["role_world"] == 4
        assert r["role_peers"] == ["mn"] * 4
        assert r["local_world_size"] == 4
    for node in (0, 1):  # each node its own directory, summary and lock
        summary = json.loads((tmp_path / f"runs/mn/node_{node}/summary.json").read_text())
        assert sorted(p["name"] for p in summary["processes"]) == (
            ["a:0", "a:1", "b:0", "b:1"] if node == 0 else ["a:2", "a:3", "b:2", "b:3"])


def test_a_failure_ends_that_nodes_launcher_non_zero(bin_dir, tmp_path):
    # Static mode: the node with the failure exits with its culprit's code (the
    # scheduler ends the others, e.g. srun --kill-on-bad-exit).
    config = write_config(tmp_path, """
        [[role]]
        name = "w"
        cpu = 1
        command = ["sh", "-c", "[ $RANK = 1 ] && exit 7; exit 0"]
        """)
    nodes = [start(bin_dir, config, "fail", "--nnodes", "2", "--node-rank", str(r)) for r in (0, 1)]
    (rc0, _, _), (rc1, _, err1) = finish(nodes[0]), finish(nodes[1])
    assert rc0 == 0 and rc1 == 7, err1


# ---- check: the plan of one node ----

def check_json(bin_dir, config, *args, env=None, cwd=None):
    r = run([bin_dir / "dflash-launch", "check", config, "--json", *args], env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


PINNED = """
    [[role]]
    name = "target"
    devices = [0, 1, 2, 3]
    nodes = [0]
    command = ["python", "t.py"]

    [[role]]
    name = "drafter"
    devices = [0, 1]
    nodes = [1, 2]
    command = ["python", "d.py"]

    [[role]]
    name = "eval"
    cpu = 1
    command = ["python", "e.py"]
    """


def test_check_node_1_of_2_prints_that_nodes_plan(bin_dir, tmp_path):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    plan = check_json(bin_dir, config, "--nnodes", "2", "--node-rank", "1", "--run-id", "x")
    assert plan["run"]["nnodes"] == 2 and plan["run"]["node_rank"] == 1
    assert plan["run"]["run_dir"].endswith("/runs/x/node_1")
    assert plan["world_size"] == 8 and plan["local_world_size"] == 4
    assert [p["rank"] for p in plan["processes"]] == [4, 5, 6, 7]
    assert [p["name"] for p in plan["processes"]] == ["a:2", "a:3", "b:2", "b:3"]
    env = plan["processes"][0]["env"]
    assert env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1"
    assert env["ROLE_WORLD_SIZE"] == "4" and env["DFLASH_NNODES"] == "2"
    # auto, several nodes: every node derives the same port from the run id
    plan0 = check_json(bin_dir, config, "--nnodes", "2", "--node-rank", "0", "--run-id", "x")
    assert plan0["run"]["master_port"] == plan["run"]["master_port"] != None
    assert env["MASTER_PORT"] == str(plan["run"]["master_port"])
    r = run([bin_dir / "dflash-launch", "check", config, "--nnodes", "2", "--node-rank", "1"])
    assert r.returncode == 0 and "node     1 of 2 (4 of the 8 processes here" in r.stdout


def test_check_pinned_roles_place_ranks_node_by_node(bin_dir, tmp_path):
    config = write_config(tmp_path, PINNED)
    for script in ("t.py", "d.py", "e.py"):  # `check` looks for the scripts the roles run (from the cwd)
        (tmp_path / script).write_text("")
    plans = [check_json(bin_dir, config, "--nnodes", "3", "--node-rank", str(n), cwd=tmp_path) for n in range(3)]
    names = [[(p["name"], p["rank"], p["gpu"]) for p in plan["processes"]] for plan in plans]
    assert names[0] == [("target:0", 0, 0), ("target:1", 1, 1), ("target:2", 2, 2), ("target:3", 3, 3),
                        ("eval:0", 4, None)]
    assert names[1] == [("drafter:0", 5, 0), ("drafter:1", 6, 1), ("eval:1", 7, None)]
    assert names[2] == [("drafter:2", 8, 0), ("drafter:3", 9, 1), ("eval:2", 10, None)]
    for plan in plans:
        assert plan["world_size"] == 11
        assert {r["name"]: r["world_size"] for r in plan["roles"]} == {"target": 4, "drafter": 4, "eval": 3}
    d = plans[1]["processes"][0]["env"]
    assert d["ROLE_WORLD_SIZE"] == "4" and d["ROLE_RANK"] == "0"
    assert d["ROLE_MASTER_ADDR"] == ""  # its role world starts on node 1: no address without a store
    assert plans[0]["processes"][4]["env"]["ROLE_MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.parametrize("args,rc,text", [
    (["--nnodes", "2", "--node-rank", "0"], 2, "pinned to node 2 but the run has 2 nodes"),
    (["--nnodes", "3", "--node-rank", "3"], 64, "node rank 3 is not one of the 3 nodes"),
    (["--nnodes", "3"], 64, "does not know which: pass --node-rank"),
])
def test_check_bad_placement(bin_dir, tmp_path, args, rc, text):
    config = write_config(tmp_path, PINNED)
    r = run([bin_dir / "dflash-launch", "check", config, *args])
    assert r.returncode == rc, r.stderr
    assert text in r.stderr and r.stdout == ""


def test_same_gpu_on_overlapping_nodes_is_a_config_error(bin_dir, tmp_path):
    config = write_config(tmp_path, PINNED.replace("nodes = [1, 2]", "nodes = [0, 1]"))
    r = run([bin_dir / "dflash-launch", "check", config])
    assert r.returncode == 2 and "GPU 0 is used by two roles" in r.stderr


def test_a_run_of_several_nodes_needs_a_shared_run_id(bin_dir, tmp_path):
    config = sleeper_config(tmp_path)
    r = run([bin_dir / "dflash-launch", "run", config, "--nnodes", "2", "--node-rank", "0"])
    assert r.returncode == 64 and "--run-id" in r.stderr
    assert not list(tmp_path.glob("started.*"))


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".", "x y"])
def test_a_run_id_is_a_plain_directory_name(bin_dir, tmp_path, bad):
    config = sleeper_config(tmp_path)
    r = run([bin_dir / "dflash-launch", "run", config, "--run-id", bad])
    assert r.returncode == 64, r.stderr
    assert not list(tmp_path.glob("started.*")) and not (tmp_path / "escape").exists()


# ---- the scheduler's env ----

def fake_scontrol(tmp_path):
    """scontrol that expands n[1-2] and knows n1's NodeAddr; it logs its argv."""
    bin = tmp_path / "fakebin"
    bin.mkdir()
    (bin / "scontrol").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {tmp_path}/scontrol.calls
        case "$1 $2" in
          "show hostnames") [ "$3" = "n[1-2]" ] || exit 1; printf 'n1\\nn2\\n' ;;
          "show node") [ "$3" = "n1" ] || exit 1
                       echo "NodeName=n1 Arch=x86_64 CoresPerSocket=1"
                       echo "   NodeAddr=10.1.2.3 NodeHostName=vm Version=22.05.8" ;;
          *) exit 2 ;;
        esac
        """))
    (bin / "scontrol").chmod(0o755)
    return bin


def slurm_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "NNODES", "NODE_RANK"))}
    env.update(PATH=f"{fake_scontrol(tmp_path)}:{env['PATH']}", SLURM_JOB_ID="77", SLURM_STEP_ID="0",
               SLURM_NNODES="2", SLURM_NODEID="1", SLURM_JOB_NODELIST="n[1-2]", SLURM_STEP_NODELIST="n[1-2]",
               SLURM_STEP_NUM_NODES="2", SLURM_STEP_NUM_TASKS="2")
    env.update(extra)
    return env


def test_slurm_env_places_the_node_and_resolves_the_first_host(bin_dir, tmp_path):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    plan = check_json(bin_dir, config, env=slurm_env(tmp_path))
    assert plan["run"]["nnodes"] == 2 and plan["run"]["node_rank"] == 1
    assert plan["run"]["master_addr"] == "10.1.2.3"  # n1's NodeAddr, not the name n1
    assert plan["run"]["run_id"] == "t-slurm-77.0"   # every node derives the same id from the job
    assert [p["rank"] for p in plan["processes"]] == [4, 5, 6, 7]
    calls = (tmp_path / "scontrol.calls").read_text().splitlines()
    assert calls == ["show hostnames n[1-2]", "show node n1"]


def test_slurm_flags_win_over_the_env(bin_dir, tmp_path):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    plan = check_json(bin_dir, config, "--node-rank", "0", "--master-addr", "h0", env=slurm_env(tmp_path))
    assert plan["run"]["node_rank"] == 0 and plan["run"]["master_addr"] == "h0"
    assert not (tmp_path / "scontrol.calls").exists()  # nothing to resolve


@pytest.mark.parametrize("extra,text", [
    ({"SLURM_STEP_ID": None}, "not an srun step"),
    ({"SLURM_STEP_NUM_TASKS": "8"}, "run exactly one per node"),
    ({"SLURM_NNODES": "two"}, "SLURM_NNODES=\"two\" is not a positive integer"),
])
def test_slurm_env_mistakes_are_usage_errors(bin_dir, tmp_path, extra, text):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    env = slurm_env(tmp_path, **{k: v for k, v in extra.items() if v is not None})
    for k, v in extra.items():
        if v is None:
            del env[k]
    r = run([bin_dir / "dflash-launch", "check", config], env=env)
    assert r.returncode == 64 and text in r.stderr, r.stderr


def test_slurm_without_scontrol_says_so(bin_dir, tmp_path):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    env = slurm_env(tmp_path)
    env["PATH"] = "/nonexistent"
    r = run([bin_dir / "dflash-launch", "check", config], env=env)
    assert r.returncode == 64 and "scontrol show hostnames" in r.stderr and "--master-addr" in r.stderr


def test_kubernetes_indexed_job_env(bin_dir, tmp_path):
    config = write_config(tmp_path, gloo_roles(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(NNODES="2", JOB_COMPLETION_INDEX="1", MASTER_ADDR="job-0.workers", MASTER_PORT="23456")
    plan = check_json(bin_dir, config, "--run-id", "k8s-1", env=env)
    assert plan["run"]["nnodes"] == 2 and plan["run"]["node_rank"] == 1
    assert plan["run"]["master_addr"] == "job-0.workers" and plan["run"]["master_port"] == 23456
    assert plan["processes"][0]["env"]["MASTER_PORT"] == "23456"
    assert plan["roles"][1]["master_port"] == 23458
    env.update(PET_NNODES="1:4")
    r = run([bin_dir / "dflash-launch", "check", config], env=env)
    assert r.returncode == 64 and "elastic ranges" in r.stderr


def test_the_slurm_example_config_places_two_nodes(bin_dir, tmp_path):
    config = ROOT / "examples/slurm/run.toml"
    (tmp_path / "train_dflash_pipeline.py").write_text("")  # the user's script, run from where it is launched
    nodes = [check_json(bin_dir, config, "--nnodes", "2", "--node-rank", str(n), "--run-id", "ex", cwd=tmp_path)
             for n in (0, 1)]
    assert [len(n["processes"]) for n in nodes] == [8, 8]
    assert [p["rank"] for p in nodes[1]["processes"]] == list(range(8, 16))
    assert {p["role"] for p in nodes[1]["processes"]} == {"drafter-remote"}
    assert nodes[0]["run"]["master_port"] == nodes[1]["run"]["master_port"]
    # Both drafter roles share one gate key: one compile for the whole run on a shared cache.
    keys = {p["gate_key"] for n in nodes for p in n["processes"] if p["role"].startswith("drafter")}
    assert keys == {"drafter"}


def test_one_slurm_node_keeps_a_fresh_run_id_per_launch(bin_dir, tmp_path):
    # Two runs one after the other in one batch script must not share a run dir.
    config = write_config(tmp_path, gloo_roles(tmp_path))
    env = slurm_env(tmp_path, SLURM_NNODES="1", SLURM_NODEID="0", SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS="1")
    plan = check_json(bin_dir, config, env=env)
    assert plan["run"]["nnodes"] == 1 and plan["run"]["run_id"] == "<run_id>"

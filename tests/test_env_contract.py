"""One process-environment contract (contract/env_vars.h), and the small trust items of `check` and `run`:
what `check` shows is what a process gets; the launcher's own DFLASH_* never leak into a process; a role's
`env` cannot override what the launcher owns; input that would crash toml++ or fail only at exec/fork is a
config error before anything starts; a full log disk is said, never a silent cut."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import run
from supervise import Run, write_config


def check(bin_dir, config, *args, env=None):
    return run([bin_dir / "dflash-launch", "check", config, *args], env=env)


# ---- the environment contract ----------------------------------------------------------------------------

def test_check_shows_every_variable_a_real_process_gets_and_nothing_of_ours_leaks_in(bin_dir, tmp_path):
    dump = tmp_path / "env.json"
    payload = (f"import json, os, dflash_launch; json.dump({{'env': dict(os.environ), "
               f"'warmup': dflash_launch.is_warmup()}}, open({str(dump)!r}, 'w'))")
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(payload)}]
        watchdog = "60s"
        env = {{ MY_KNOB = "1" }}
        """)
    # A shell that ran a warm-up or a gated payload by hand, then the launcher: none of it is the run's.
    stale = {"DFLASH_WARMUP": "1", "DFLASH_GATE_KEY": "stale-key", "DFLASH_GATE_ROLE": "lead",
             "DFLASH_GATE_HOLDER": "stale", "DFLASH_RUN_WORLD_SIZE": "9", "DFLASH_RUN_ROLE_WORLD_SIZE": "9",
             "DFLASH_STORE": "redis://127.0.0.1:1", "WATCHDOG_USEC": "1",
             "DFLASH_PORT_HTTP": "1", "DFLASH_P_HTTP_PORTS": "1,2"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **stale)
    run_id = f"envc-{uuid.uuid4().hex[:8]}"
    shown = check(bin_dir, config, "--json", "--run-id", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    check_env = json.loads(shown.stdout)["processes"][0]["env"]
    r = Run(bin_dir, config, run_id=run_id, env=env)
    assert r.wait(timeout=120) == 0, r.err
    got = json.load(open(dump))
    assert got["warmup"] is False  # is_warmup() in an ungated process: the launcher's DFLASH_WARMUP=1 stayed out
    real = got["env"]
    for k in stale:
        if k not in check_env:
            assert k not in real, f"{k} leaked from the launcher's environment into the process"
    # Every variable the process has that the launcher's environment did not give it, `check` shows.
    added = {k for k, v in real.items() if env.get(k) != v}
    assert added - set(check_env) <= {"PWD", "_", "SHLVL"}, added - set(check_env)
    assert {"WATCHDOG_USEC", "PYTHONFAULTHANDLER", "NOTIFY_SOCKET", "DFLASH_RUN_TOKEN"} <= set(check_env)
    assert real["WATCHDOG_USEC"] == check_env["WATCHDOG_USEC"] == "60000000"
    for k, v in check_env.items():  # and the values are the ones it shows, but what only the run can know
        if not v.startswith("<"):
            assert real.get(k) == v, (k, real.get(k), v)


@pytest.mark.parametrize("name", ["DFLASH_STORE", "DFLASH_RUN_WORLD_SIZE", "DFLASH_RUN_ROLE_WORLD_SIZE",
                                  "DFLASH_GATE_HOLDER", "WATCHDOG_USEC", "NOTIFY_SOCKET", "DFLASH_RUN_TOKEN",
                                  "DFLASH_PORT_HTTP", "DFLASH_WEB_SERVE_HTTP_PORTS"])
def test_a_launcher_owned_variable_in_a_roles_env_is_a_config_error(bin_dir, tmp_path, name):
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["true"]
        env = {{ {name} = "x" }}
        """)
    r = check(bin_dir, config)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{config}:10:9: error: role[p].env: {name} is set by dflash-launch" in r.stderr, r.stderr
    assert "hint:" in r.stderr and "nothing was started" in r.stderr


# ---- input that used to pass `check` and crash or fail later -----------------------------------------------

@pytest.mark.parametrize("shape", ["dotted", "arrays", "inline-tables", "header"])
def test_deep_nesting_is_a_config_error_not_a_segfault(bin_dir, tmp_path, shape):
    deep = {"dotted": "x" + ".x" * 40000 + " = 1\n",
            "arrays": "x = " + "[" * 40000 + "]" * 40000 + "\n",
            "inline-tables": "x = " + "{ a = " * 40000 + "1" + " }" * 40000 + "\n",
            "header": "[" + "x." * 40000 + "x]\n"}[shape]
    config = tmp_path / "run.toml"
    config.write_text('[run]\nname = "n"\n' + deep)
    r = check(bin_dir, config)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # on toml++ alone: -11 (SIGSEGV)
    assert f"{config}:3:" in r.stderr and "nested deeper than 64 levels" in r.stderr, r.stderr[:2000]


def test_an_argument_over_max_arg_strlen_is_a_config_error(bin_dir, tmp_path):
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["echo", "{'a' * (1 << 20)}"]
        """)
    r = check(bin_dir, config)
    assert r.returncode == 2, r.stderr[:2000]
    assert f"{config}:9:" in r.stderr and "role[p].command" in r.stderr and "MAX_ARG_STRLEN" in r.stderr
    # And `run` refuses it before anything starts (it used to start, then fail at exec with 126).
    run_r = Run(bin_dir, config, run_id=f"envc-{uuid.uuid4().hex[:8]}")
    assert run_r.wait(timeout=60) == 2, run_r.err[:2000]
    assert not (run_r.run_dir / "attempt_0").exists()


def test_an_env_value_over_max_arg_strlen_is_a_config_error(bin_dir, tmp_path):
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["true"]
        env = {{ BLOB = "{'b' * 200 * 1024}" }}
        """)
    r = check(bin_dir, config)
    assert r.returncode == 2, r.stderr[:2000]
    assert f"{config}:10:" in r.stderr and "role[p].env.BLOB" in r.stderr, r.stderr[:2000]


def test_more_processes_than_this_host_has_pids_is_a_config_error(bin_dir, tmp_path):
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    roles = pid_max // 4096 + 1
    if roles > 64:
        pytest.skip(f"pid_max {pid_max}: a config over it would take too long to plan")
    body = "".join(f"""
        [[role]]
        name = "r{i}"
        cpu = 4096
        command = ["true"]
        """ for i in range(roles))
    r = check(bin_dir, write_config(tmp_path, body))
    assert r.returncode == 2, r.stderr[:2000]
    assert f"would start {roles * 4096} processes" in r.stderr and "pid_max" in r.stderr, r.stderr[:2000]


# ---- a full disk under the log dir -------------------------------------------------------------------------

@pytest.fixture
def tiny_log_dir(tmp_path):
    """A 64 KiB tmpfs: the log dir fills while the run goes."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "logs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_log_disk_is_an_error_never_a_silent_cut(bin_dir, tmp_path, tiny_log_dir):
    config = tmp_path / "run.toml"
    (tmp_path / "cache").mkdir(mode=0o700)
    # Rank 0 fills the log dir; then 60 exits make the supervisor log pages of lines onto a full disk.
    fill = ("if [ $RANK = 0 ]; then head -c 2000000 /dev/zero > $DFLASH_RUN_DIR/fill; touch $DFLASH_RUN_DIR/filled; fi; "
            "while [ ! -e $DFLASH_RUN_DIR/filled ]; do sleep 0.05; done; echo bye")
    config.write_text(textwrap.dedent(f"""\
        [run]
        name = "full"
        cache_dir = "cache"
        log_dir = "{tiny_log_dir}"

        [[role]]
        name = "p"
        cpu = 60
        command = ["sh", "-c", {json.dumps(fill)}]
        """))
    run_id = f"envc-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", run_id, "--plain"],
                       capture_output=True, text=True, timeout=300)
    run_dir = tiny_log_dir / run_id
    log = (run_dir / "supervisor.log").read_bytes()
    assert log.endswith(b"\n"), log[-200:]  # never a line cut in half (main: "... (pid 9599, attempt 0, c")
    assert not (run_dir / "summary.json").exists()
    # The processes succeeded, the run's record did not: exit 1, said on the console and in the reason.
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    out = r.stdout + r.stderr
    assert "[dflash] error: supervisor.log lost " in out and "No space left on device" in out, out[-3000:]
    assert f"cannot write {run_dir}/summary.json" in out, out[-3000:]
    assert "every process succeeded, but the run's records are incomplete" in out, out[-3000:]
    assert "summary in " not in out, out[-3000:]  # main's last line pointed to the summary.json it could not write


def test_the_docs_environment_table_is_the_headers():
    """docs/config.md's one table of the process environment (issue #39: it listed DFLASH_* three times, with
    conflicting meanings) names exactly contract/env_vars.h's variables and families, each with its kind."""
    import re
    from conftest import ROOT
    header = (ROOT / "contract" / "env_vars.h").read_text()
    names = dict(re.findall(r'inline constexpr char (k\w+)\[\] = "([A-Z_]+)";', header))
    kinds = {names[k]: kind.lower() for k, kind in
             re.findall(r"\{(k\w+), VarKind::k(Owned|Default)\}", header.split("kProcessVars[] = {")[1].split("};")[0])}
    assert len(kinds) > 50
    doc = (ROOT / "docs" / "config.md").read_text().split("## The environment of each process")[1]
    doc = doc.split("\n## ")[0]
    table = {}
    for row in re.findall(r"(?m)^\| (`[^|]+) \| (owned|default) \|", doc):
        for var in re.findall(r"`([A-Z_<>]+)`", row[0]):
            table[var] = row[1]
    families = {"DFLASH_PORT_<NAME>": "owned", "DFLASH_<ROLE>_<NAME>_PORTS": "owned"}
    assert table == dict(kinds, **families)

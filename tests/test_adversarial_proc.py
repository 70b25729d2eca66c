"""Adversarial process tests (issue #12, the process half): what a hostile or careless payload does to the
supervisor, built at test time. Each test failed on the launcher before the fix (docs/reliability.md has the
figures). DFLASH_LONG_TESTS=1 runs the long variants (20 kill loops, 1000 processes)."""
import json
import os
import random
import resource
import signal
import subprocess
import time

import pytest

from conftest import run
from supervise import alive_with_marker, holds_for, proc_table, wait_until, write_config

LONG = os.environ.get("DFLASH_LONG_TESTS") == "1"


def marker():
    return f"3600.{random.randrange(10**8):08d}"


def role(name, command, extra="", cpu=1):
    return f'\n[[role]]\nname = "{name}"\ncpu = {cpu}\ncommand = {json.dumps(command)}\n{extra}\n'



def double_fork_script(tmp_path):
    """`python3 dfork.py M`: a helper that forks, calls setsid, forks again and execs `sleep M` (a daemon:
    new session, parent gone, re-parented), while the first process keeps running as `sleep M` too."""
    path = tmp_path / "dfork.py"
    path.write_text(
        "import os, sys\n"
        "m = sys.argv[1]\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['sleep', m])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "os.execvp('sleep', ['sleep', m])\n")
    return path


def hostile_roles(tmp_path, m):
    """Payload trees that PR_SET_PDEATHSIG alone does not cover, and how many processes of each hold `m`."""
    dfork = double_fork_script(tmp_path)
    body = ""
    body += role("shbg", ["sh", "-c", f"sleep {m} & sleep {m}"])                      # sh + 2 sleeps
    body += role("bashpy", ["bash", "-c", f"python3 -c 'import time; time.sleep({m})'; echo done"])  # bash + py
    body += role("dfork", ["python3", str(dfork), m])                                 # sleep + daemon sleep
    # Hosted by dflash-worker (ready = log needs a host): worker + sh + 2 sleeps.
    body += role("hosted", ["sh", "-c", f"echo up; sleep {m} & sleep {m}"], 'ready = { mode = "log", pattern = "up" }')
    return body, 3 + 2 + 2 + 4


def no_cgroup_env():
    return dict(os.environ, DFLASH_CGROUP="off")


MODES = ["fallback", "cgroup"]


def mode_env(mode):
    return no_cgroup_env() if mode == "fallback" else dict(os.environ, DFLASH_CGROUP="require")


def cgroup_usable(bin_dir, tmp_path):
    """Whether this machine lets the launcher make a cgroup v2 sub-tree (else the cgroup variant is skipped)."""
    (tmp_path / "probe").mkdir()
    cfg = write_config(tmp_path / "probe", role("t", ["true"]))
    r = run([bin_dir / "dflash-launch", "run", cfg, "--run-id", "probe"], env=mode_env("cgroup"))
    return r.returncode == 0


@pytest.mark.parametrize("mode", MODES)
def test_sigkill_storm_of_the_supervisor_leaves_no_descendant(launch, bin_dir, tmp_path, mode):
    """kill -9 of dflash-launch: every descendant (background jobs of a shell, a python under bash, a
    double-forked setsid daemon, a worker's payload tree) is gone within 1 s (10x what the guardian needs)."""
    if mode == "cgroup" and not cgroup_usable(bin_dir, tmp_path):
        pytest.skip("no writable cgroup v2 sub-tree here")
    loops = 20 if LONG else 4
    worst = 0.0
    for i in range(loops):
        m = marker()
        body, expected = hostile_roles(tmp_path, m)
        r = launch(write_config(tmp_path, body), run_id=f"{mode}{i}", env=mode_env(mode))
        assert wait_until(lambda: len(alive_with_marker(m)) >= expected, timeout=30), (
            i, alive_with_marker(m), expected)
        os.kill(r.pid, signal.SIGKILL)
        r.wait()
        t = time.time()
        gone = wait_until(lambda: not alive_with_marker(m), timeout=1.0)
        worst = max(worst, time.time() - t)
        assert gone, f"loop {i}: {len(alive_with_marker(m))}/{expected} survived: {alive_with_marker(m)}"
    print(f"{mode}: {loops} loops, 0 survivors, slowest clean-up {worst:.3f}s")


def test_sigkill_at_random_moments_of_start_up_leaves_nothing(launch, tmp_path):
    """A storm: kill -9 while processes are still being spawned (forks, execs, double forks in flight)."""
    loops = 20 if LONG else 5
    for i in range(loops):
        m = marker()
        body, _ = hostile_roles(tmp_path, m)
        r = launch(write_config(tmp_path, body), run_id=f"s{i}", env=no_cgroup_env())
        r.wait_for_log("processes, logs in")
        # Whatever has started by now (from nothing to all of it) must go.
        wait_until(lambda: len(alive_with_marker(m)) >= 1 + i % 6, timeout=10)
        os.kill(r.pid, signal.SIGKILL)
        r.wait()
        assert wait_until(lambda: not alive_with_marker(m), timeout=1.0), (i, alive_with_marker(m))


def test_a_dead_workers_payload_tree_goes_with_it(launch, tmp_path):
    """SIGKILL of a dflash-worker: its payload dies by PDEATHSIG, and the payload's own children (and a
    setsid daemon of theirs) are killed by the supervisor as that worker's leftovers; the log says whose."""
    m = marker()
    dfork = double_fork_script(tmp_path)
    body = role("hosted", ["sh", "-c", f"echo up; python3 {dfork} {m} & sleep {m}"],
                'ready = { mode = "log", pattern = "up" }')
    body += role("keep", ["sleep", m + "1"])
    r = launch(write_config(tmp_path, body), env=no_cgroup_env())
    r.wait_for_log("all 2 processes are running")
    assert wait_until(lambda: len(alive_with_marker(m)) >= 5, timeout=30)  # worker, sh, sleep, sleep, daemon
    table = proc_table()  # one snapshot: a process may end between two looks
    worker = [p for p in alive_with_marker(m) if p in table and "dflash-worker" in table[p][2]]
    assert len(worker) == 1
    os.kill(worker[0], signal.SIGKILL)
    # One /proc snapshot per look: a process may end between two (keep:0 is stopped meanwhile).
    def hosted_left():
        table = proc_table()
        return [p for p in alive_with_marker(m) if p in table and m + "1" not in table[p][2]]
    assert wait_until(lambda: not hosted_left())  # a hang detector: none may be left, however slow the machine
    r.wait()  # the worker's death fails the run (no restart)
    assert "leftover" in (r.run_dir / "supervisor.log").read_text()
    assert "of hosted:0" in (r.run_dir / "supervisor.log").read_text()
    assert alive_with_marker(m) == []


def test_a_live_ranks_double_forked_helper_survives_an_unrelated_exit(launch, tmp_path):
    """Orphans of a live process are its own business: when another role exits 0, the running rank's
    double-forked helper (re-parented to the supervisor, a subreaper) keeps running. It is killed only
    once its own process is dead, and the log names that process."""
    m = marker()
    dfork = double_fork_script(tmp_path)
    body = role("rank", ["python3", str(dfork), m])
    # An unrelated role that exits 0 when the test says so (a FIFO it reads: opened once we write).
    os.mkfifo(tmp_path / "go")
    body += role("short", ["sh", "-c", "read x < go; exit 0"], 'cwd = "."')
    r = launch(write_config(tmp_path, body), env=no_cgroup_env())
    # Both must have exec'd `sleep` (while python forks, its copies carry the marker too for an instant).
    sleeps = lambda: [p for p in alive_with_marker(m) if proc_table().get(p, (0, "", ""))[2].startswith("sleep ")]
    assert wait_until(lambda: len(sleeps()) == 2 and len(alive_with_marker(m)) == 2, timeout=30)
    with open(tmp_path / "go", "w") as f:
        f.write("go\n")
    r.wait_for_log("short:0 RUNNING -> EXITED")
    # The helper: not a session leader (it called setsid, then forked), and re-parented to the supervisor.
    helper = [p for p in alive_with_marker(m) if os.getsid(p) != p and proc_table()[p][0] == r.pid]
    # The helper is still there after the supervisor handled the unrelated exit (the kill, if any, was sent
    # before the EXITED line: give it 1 s, 100x what a SIGKILL takes to land).
    assert holds_for(lambda: len(alive_with_marker(m)) >= 2, 1.0), "the live rank's helper was killed"
    assert "leftover" not in (r.run_dir / "supervisor.log").read_text()
    assert helper, "the helper was not re-parented to the supervisor"
    # Now its rank dies: the helper goes too, as the rank's leftover.
    rank = [p for p in alive_with_marker(m) if p not in helper]
    os.kill(rank[0], signal.SIGKILL)
    assert wait_until(lambda: not alive_with_marker(m))
    r.wait()
    log = (r.run_dir / "supervisor.log").read_text()
    assert "leftover" in log and "of rank:0" in log


def limit_fds(soft, hard):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("n", [1, 6])
def test_spawn_failure_at_a_tiny_fd_limit_is_a_failure(bin_dir, tmp_path, n):
    """ulimit -n 14 (hard too: nothing to raise to): some process cannot even get its pipes (with one
    process the launcher said "all processes succeeded", exit 0). That process is FAILED with the reason,
    the run exits non-zero, the launcher says the plan does not fit."""
    m = marker()
    body = "".join(role(f"r{i}", ["sleep", m]) for i in range(n))
    cfg = write_config(tmp_path, body)
    p = subprocess.run([str(bin_dir / "dflash-launch"), "run", str(cfg), "--run-id", "fd"], capture_output=True,
                       text=True, timeout=60, preexec_fn=limit_fds(14, 14), env=no_cgroup_env())
    assert p.returncode != 0, p.stdout + p.stderr
    assert "all processes succeeded" not in p.stdout + p.stderr
    assert "Too many open files" in p.stdout + p.stderr
    s = json.loads((tmp_path / "runs" / "fd" / "summary.json").read_text())
    assert s["exit_code"] == p.returncode
    failed = [q for q in s["processes"] if q["state"] == "FAILED"]
    if failed:
        assert all("Too many open files" in q["reason"] for q in failed), s["processes"]
    else:
        # So few fds that the supervisor's own loop (after the run's port locks) could not be set up:
        # nothing was started, and the summary says why -- still never "succeeded".
        assert "Too many open files" in s["reason"] and "no process was started" in s["reason"], s["reason"]
        assert {q["state"] for q in s["processes"]} == {"NOT_STARTED"}
    # Those it never got to (the run stopped at the first failure) say so, not STARTING.
    assert {q["state"] for q in s["processes"]} <= {"FAILED", "NOT_STARTED", "EXITED"}, s["processes"]
    assert "file descriptors" in p.stdout + p.stderr  # N processes need ~M fds
    assert alive_with_marker(m) == []


def test_the_soft_fd_limit_is_raised_to_the_hard_limit(bin_dir, tmp_path):
    """soft 64, hard 4096: 40 processes need more than 64 fds; the launcher raises its soft limit and all run."""
    body = "".join(role(f"r{i}", ["true"]) for i in range(40))
    cfg = write_config(tmp_path, body)
    p = subprocess.run([str(bin_dir / "dflash-launch"), "run", str(cfg), "--run-id", "fd"], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit_fds(64, 4096), env=no_cgroup_env())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "runs" / "fd" / "summary.json").read_text())
    assert [q["state"] for q in s["processes"]] == ["EXITED"] * 40


def test_exec_failures_are_labelled_as_such_not_collateral(launch, tmp_path):
    """Three processes whose exec fails (126: an interpreter without the x bit; 127: a missing interpreter,
    which only exec can see): each is FAILED with its reason and exit code, none "collateral" of another."""
    interp = tmp_path / "interp"
    interp.write_text("#!/bin/sh\n")
    interp.chmod(0o644)
    noexec = tmp_path / "noexec.sh"
    noexec.write_text(f"#!{interp}\nexit 0\n")
    missing = tmp_path / "missing.sh"
    missing.write_text("#!/nonexistent/interpreter\nexit 0\n")
    for f in (noexec, missing):
        f.chmod(0o755)
    body = role("a", [str(noexec)]) + role("b", [str(noexec)]) + role("c", [str(missing)])
    r = launch(write_config(tmp_path, body))
    rc = r.wait()
    assert rc in (126, 127)
    s = r.summary()
    by = {q["name"]: q for q in s["processes"]}
    for q in s["processes"]:
        assert q["state"] == "FAILED", q
        assert not q["collateral"], q
        assert "cannot execute" in q["reason"], q
    assert by["a:0"]["exit_code"] == 126 and "(exit 126)" in by["a:0"]["reason"]
    assert by["c:0"]["exit_code"] == 127 and "(exit 127)" in by["c:0"]["reason"]
    assert "collateral" not in r.out


def test_env_value_with_nul_is_rejected(bin_dir, tmp_path):
    cfg = write_config(tmp_path, role("r", ["true"], 'env = { A = "x\\u0000y" }'))
    for cmd in ("check", "run"):
        p = run([bin_dir / "dflash-launch", cmd, cfg])
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        assert "NUL" in p.stderr and "run.toml:" in p.stderr, p.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_check_flags_a_command_that_cannot_be_executed(bin_dir, tmp_path):
    noexec = tmp_path / "noexec.sh"
    noexec.write_text("#!/bin/sh\n")
    noexec.chmod(0o644)
    for command, what in ([["no-such-command-dflash-xyz"], "not found"], [[str(noexec)], "not executable"],
                          [[str(tmp_path / "missing")], "not found"]):
        cfg = write_config(tmp_path, role("r", command))
        p = run([bin_dir / "dflash-launch", "check", cfg])
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert what in p.stderr and "role[r].command" in p.stderr, p.stderr
        line = [l for l in cfg.read_text().splitlines()].index(f"command = {json.dumps(command)}") + 1
        assert f"run.toml:{line}:" in p.stderr, p.stderr
    # The role's own PATH decides: a command found only there passes.
    bindir = tmp_path / "mybin"
    bindir.mkdir()
    (bindir / "mytool").write_text("#!/bin/sh\n")
    (bindir / "mytool").chmod(0o755)
    cfg = write_config(tmp_path, role("r", ["mytool"], f'env = {{ PATH = "{bindir}:/usr/bin:/bin" }}'))
    assert run([bin_dir / "dflash-launch", "check", cfg]).returncode == 0


@pytest.mark.skipif(not LONG, reason="long: DFLASH_LONG_TESTS=1")
def test_stopping_1000_processes_takes_about_the_grace(launch, tmp_path):
    """1000 processes, stop.grace = 5s, all of them ignore SIGTERM: the stop takes the grace plus a little,
    not grace + N x a /proc scan (8.7 s before)."""
    m = marker()
    body = "".join(role(f"r{i}", ["sh", "-c", f"trap '' TERM; exec sleep {m}"],
                        'stop = { signal = "SIGTERM", grace = "5s" }') for i in range(1000))
    r = launch(write_config(tmp_path, body))
    r.wait_for_log("all 1000 processes are running", timeout=300)
    t = time.time()
    r.signal(signal.SIGTERM)
    r.wait(timeout=120)
    took = time.time() - t
    print(f"stop of 1000 took {took:.2f}s")
    # Each of them was SIGKILLed at its grace (the supervisor says so once per process); how long the stop took
    # is load, printed above (the property "grace + a little, not grace + N x a scan" is bench/supervisor's).
    assert r.count_in_log("still running after its grace: SIGKILL") == 1000
    assert alive_with_marker(m) == []

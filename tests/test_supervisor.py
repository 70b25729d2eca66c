"""dflash-launch run: real processes, real signals (issue #4)."""
import json
import os
import random
import signal
import socket
import sys
import time

import pytest

from supervise import alive_with_marker, descendants, holds_for, proc_table, wait_until, write_config


def marker():
    """A unique `sleep` argument: lets a test find exactly its own processes."""
    return f"3600.{random.randrange(10**8):08d}"


def roles(n, command, extra="", name="r"):
    out = ""
    for i in range(n):
        out += f'\n[[role]]\nname = "{name}{i}"\ncpu = 1\ncommand = {json.dumps(command)}\n{extra}\n'
    return out



def test_eight_roles_run_then_sigterm_stops_all_within_grace(launch, tmp_path):
    m = marker()
    cfg = write_config(tmp_path, roles(8, ["sleep", m], 'stop = { grace = "5s" }'))
    r = launch(cfg)
    r.wait_for_log("all 8 processes are running")
    assert len(alive_with_marker(m, payloads_only=True)) == 8
    r.signal(signal.SIGTERM)
    assert r.wait() == 128 + signal.SIGTERM
    # Within the grace: nobody needed the SIGKILL that comes when it runs out (no wall clock needed).
    assert r.count_in_log("still running after its grace: SIGKILL") == 0
    assert alive_with_marker(m) == []
    s = r.summary()
    assert s["exit_code"] == 143 and s["culprit"] is None and "stopped by SIGTERM" in s["reason"]
    for p in s["processes"]:
        assert p["state"] == "EXITED" and not p["culprit"] and not p["collateral"]
        assert p["signal"] == "SIGTERM"  # the payload's own end, reported by its worker


def test_a_child_that_ignores_sigterm_is_killed_after_grace(launch, tmp_path):
    m = marker()
    # The trap makes sh and its sleep ignore SIGTERM; only SIGKILL ends them. Ready once the trap is set: with
    # ready = "none" it counted as running at exec, and a SIGTERM that came before `trap` ran ended it at once.
    cfg = write_config(tmp_path, roles(1, ["sh", "-c", f"trap '' TERM; echo trapped; sleep {m}; true"],
                                       'stop = { grace = "1s" }\nready = { mode = "log", pattern = "^trapped$" }'))
    r = launch(cfg)
    r.wait_for_log("all 1 processes are running")
    assert r.proc.poll() is None, ("the run ended before it was stopped", r.proc.returncode)
    t = time.monotonic()
    r.signal(signal.SIGTERM)
    r.wait()
    took = time.monotonic() - t
    # The SIGKILL came after the 1 s grace, not before (load can only make it later); that it came at all is
    # the run having ended (r.wait) with the SIGKILL line below.
    log = (r.run_dir / "supervisor.log").read_text() if (r.run_dir / "supervisor.log").exists() else ""
    assert took >= 1.0, (took, r.err[-2000:], log[-3000:])
    assert r.count_in_log("still running after its grace: SIGKILL") == 1
    assert alive_with_marker(m) == []


def test_sigkill_of_the_supervisor_leaves_no_child(launch, tmp_path):
    for i in range(20):
        m = marker()
        cfg = write_config(tmp_path, roles(8, ["sleep", m]))
        r = launch(cfg, run_id=f"k{i}")
        r.wait_for_log("all 8 processes are running")
        assert len(alive_with_marker(m, payloads_only=True)) == 8
        os.kill(r.pid, signal.SIGKILL)
        r.wait()
        # 1 s: 10x what the guardian and PR_SET_PDEATHSIG need (test_adversarial_proc measures it).
        assert wait_until(lambda: not alive_with_marker(m), timeout=1.0), f"run {i}: {alive_with_marker(m)}"


def test_failure_names_the_culprit_and_stops_peers(launch, tmp_path):
    m = marker()
    body = roles(3, ["sleep", m], name="peer") + roles(1, ["sh", "-c", "sleep 0.3; echo failing >&2; exit 3"], name="bad")
    r = launch(write_config(tmp_path, body))
    assert r.wait() == 3
    s = r.summary()
    assert s["culprit"] == "bad0:0" and s["exit_code"] == 3
    assert "exited with code 3" in s["reason"]
    by = {p["name"]: p for p in s["processes"]}
    assert by["bad0:0"]["culprit"] and not by["bad0:0"]["collateral"]
    for n in ("peer0:0", "peer1:0", "peer2:0"):
        assert by[n]["collateral"] and not by[n]["culprit"]
    assert alive_with_marker(m) == []
    assert "culprit" in r.out and "bad0:0" in r.out  # the table at the end


def test_sigsegv_exits_139_and_says_so(launch, tmp_path):
    r = launch(write_config(tmp_path, roles(1, ["sh", "-c", "kill -SEGV $$"])))
    assert r.wait() == 139
    p = r.summary()["processes"][0]
    assert p["exit_code"] == 139 and p["signal"] == "SIGSEGV" and "SIGSEGV" in p["reason"]


def test_missing_binary_exits_127_naming_the_path(launch, tmp_path):
    # `run` refuses a command that is not there before spawning anything (exit 2, like `check`); what only
    # exec can find out is a script whose interpreter is missing: ENOENT at exec, 127.
    script = tmp_path / "payload-x"
    script.write_text("#!/nonexistent/dir/interpreter\n")
    script.chmod(0o755)
    r = launch(write_config(tmp_path, roles(1, [str(script)])))
    assert r.wait() == 127
    assert str(script) in r.summary()["reason"]
    assert "No such file or directory" in r.summary()["reason"]


def test_not_executable_exits_126(launch, tmp_path):
    # The interpreter exists but cannot be executed: EACCES at exec, 126.
    interp = tmp_path / "interp"
    interp.write_text("#!/bin/sh\n")
    interp.chmod(0o644)
    script = tmp_path / "script.sh"
    script.write_text(f"#!{interp}\necho hi\n")
    script.chmod(0o755)
    r = launch(write_config(tmp_path, roles(1, [str(script)])))
    assert r.wait() == 126
    assert str(script) in r.summary()["reason"]


def test_exec_failures_leave_no_zombie(launch, tmp_path):
    # A role that keeps failing to exec (restarted), beside one that keeps the run alive.
    m = marker()
    bad = tmp_path / "payload-y"
    bad.write_text("#!/nonexistent/interpreter-y\n")
    bad.chmod(0o755)
    body = roles(1, ["sleep", m], name="keep") + roles(
        1, [str(bad)],
        'restart = { policy = "on-failure", max = 1000, window = "1h", backoff = "50ms..50ms" }', name="bad")
    r = launch(write_config(tmp_path, body))
    # Six exec failures: the first five have been restarted (the sixth's restart may still be pending).
    r.wait_for_log("bad0:0 STARTING -> BACKOFF", count=6)
    zombies = lambda: [pid for pid, (ppid, st, _) in proc_table().items() if st == "Z" and (
        ppid == r.pid or ppid in descendants(r.pid))]
    # Reaping is immediate; a zombie may exist for an instant (the restarts go on), never for good.
    assert wait_until(lambda: not zombies()), zombies()
    r.signal(signal.SIGTERM)
    r.wait()
    assert r.summary()["processes"][1]["restarts"] >= 5


def restart_config(tmp_path, scope, m):
    flaky = ("echo $$ >> pids.$DFLASH_PROCESS; echo $TORCHELASTIC_RESTART_COUNT >> attempts.$DFLASH_PROCESS; "
             "if [ $DFLASH_PROCESS = flaky:0 ] && [ $DFLASH_ATTEMPT = 0 ]; then exit 1; fi; exec sleep " + m)
    stable = "echo $$ >> pids.$DFLASH_PROCESS; exec sleep " + m
    body = f"""
[[role]]
name = "stable"
cpu = 2
command = ["sh", "-c", "{stable}"]
cwd = "."
restart = {{ policy = "on-failure", scope = "process", max = 3, window = "1h", backoff = "100ms..100ms" }}

[[role]]
name = "flaky"
cpu = 2
command = ["sh", "-c", "{flaky}"]
cwd = "."
restart = {{ policy = "on-failure", scope = "{scope}", max = 3, window = "1h", backoff = "100ms..100ms" }}
"""
    return write_config(tmp_path, body)


def pids(tmp_path, name):
    f = tmp_path / f"pids.{name}"
    return f.read_text().split() if f.exists() else []


@pytest.mark.parametrize("scope,restarted", [
    ("process", {"flaky:0"}),
    ("role", {"flaky:0", "flaky:1"}),
    ("all", {"flaky:0", "flaky:1", "stable:0", "stable:1"}),
])
def test_restart_scope(launch, tmp_path, scope, restarted):
    m = marker()
    r = launch(restart_config(tmp_path, scope, m))
    names = ["stable:0", "stable:1", "flaky:0", "flaky:1"]
    # Each restarted process starts its attempt 1; the others never do.
    assert wait_until(lambda: all(r.count_in_log(f"{n} STARTING (pid") == (2 if n in restarted else 1)
                                  for n in names))
    assert wait_until(lambda: all(r.state_of(n) == "RUNNING" for n in names))
    # And nothing else happens: a spurious restart would come after the 100 ms backoff; 1 s is 10x that.
    starts = {n: r.count_in_log(f"{n} STARTING (pid") for n in names}
    assert holds_for(lambda: {n: r.count_in_log(f"{n} STARTING (pid") for n in names} == starts, 1.0)
    for n in names:
        assert r.count_in_log(f"{n} STARTING (pid") == (2 if n in restarted else 1), n
        if n not in restarted:
            assert len(pids(tmp_path, n)) == 1, n  # the same process all along
    assert (tmp_path / "attempts.flaky:0").read_text().split() == ["0", "1"]
    r.signal(signal.SIGTERM)
    assert r.wait() == 143
    by = {p["name"]: p for p in r.summary()["processes"]}
    for n in names:
        assert by[n]["restarts"] == (1 if n in restarted else 0), n
        assert by[n]["state"] == "EXITED"
    assert alive_with_marker(m) == []


def test_budget_of_three_makes_the_fourth_failure_fatal(launch, tmp_path):
    body = roles(1, ["sh", "-c", "exit 5"],
                 'restart = { policy = "on-failure", max = 3, window = "1h", backoff = "50ms..50ms" }')
    r = launch(write_config(tmp_path, body))
    assert r.wait() == 5
    s = r.summary()
    p = s["processes"][0]
    assert p["state"] == "FATAL" and p["restarts"] == 3 and p["culprit"]
    assert "restart budget exhausted" in s["reason"] and "max 3" in s["reason"]


def test_backoff_grows_then_caps(launch, tmp_path):
    body = roles(1, ["sh", "-c", "date +%s.%N >> starts; exit 1"],
                 'cwd = "."\nrestart = { policy = "on-failure", max = 4, window = "1h", backoff = "200ms..800ms" }')
    r = launch(write_config(tmp_path, body))
    assert r.wait() == 1
    # The schedule the supervisor chose (its log says it): doubles from 200ms, capped at 800ms.
    delays = [line.rsplit("after ", 1)[1] for line in r.run_dir.joinpath("supervisor.log").read_text().splitlines()
              if "-> BACKOFF" in line]
    assert delays == ["200ms", "400ms", "800ms", "800ms"], delays
    # And it kept to it: no restart came before its delay (load can only make a gap longer, so no
    # upper bound here -- that would measure the machine, not the supervisor).
    starts = [float(x) for x in (tmp_path / "starts").read_text().split()]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) == 4
    for gap, delay in zip(gaps, [0.2, 0.4, 0.8, 0.8]):
        assert gap >= delay, gaps


def test_no_restart_exit_codes_are_honoured(launch, tmp_path):
    body = roles(1, ["sh", "-c", "exit 2"],
                 'restart = { policy = "on-failure", max = 3, window = "1h", backoff = "50ms..50ms", '
                 'no_restart_exit_codes = [2] }')
    r = launch(write_config(tmp_path, body))
    assert r.wait() == 2
    p = r.summary()["processes"][0]
    assert p["restarts"] == 0 and "no_restart_exit_codes" in p["reason"]


def test_payload_sees_only_fds_0_1_2_and_its_environment(launch, tmp_path):
    body = """
[[role]]
name = "gpu"
devices = [3, 5]
command = ["sh", "-c", "env > env.$DFLASH_PROCESS; exec python3 fds.py > fds.$DFLASH_PROCESS"]
cwd = "."
"""
    # The fds of the process itself (listdir's own directory fd is closed again by then).
    (tmp_path / "fds.py").write_text(
        "import os\n"
        "fds = os.listdir('/proc/self/fd')\n"
        "print(' '.join(sorted(f for f in fds if os.path.exists('/proc/self/fd/' + f))))\n")
    env = dict(os.environ, NOTIFY_SOCKET="@not-for-children")
    r = launch(write_config(tmp_path, body), env=env)
    assert r.wait() == 0
    for i, gpu in enumerate([3, 5]):
        assert (tmp_path / f"fds.gpu:{i}").read_text().split() == ["0", "1", "2"]
        penv = dict(l.split("=", 1) for l in (tmp_path / f"env.gpu:{i}").read_text().splitlines() if "=" in l)
        assert penv["CUDA_VISIBLE_DEVICES"] == str(gpu)
        assert penv["LOCAL_RANK"] == "0" and penv["RANK"] == str(i) and penv["WORLD_SIZE"] == "2"
        assert penv["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")
        assert penv.get("NOTIFY_SOCKET") != "@not-for-children"


def test_forwarded_signal_reaches_every_payload(launch, tmp_path):
    cmd = ["sh", "-c", "trap 'echo got usr1; exit 0' USR1; echo armed; while :; do sleep 0.05; done"]
    cfg = write_config(tmp_path, 'forward_signals = ["SIGUSR1"]\n' + roles(3, cmd))
    # forward_signals belongs in [run]: write_config's [run] table is still open here.
    r = launch(cfg)
    r.wait_for_log("all 3 processes are running")
    # Running is not armed: a shell that has not reached its `trap` yet dies of SIGUSR1 (seen on a loaded host).
    armed = lambda: sum("armed" in f.read_text() for f in (r.run_dir / "attempt_0").glob("*.stdout.log")) == 3
    assert wait_until(armed, 30), "the payloads never armed their traps"
    r.signal(signal.SIGUSR1)
    assert r.wait() == 0
    assert r.out.count("got usr1") == 3


def test_second_interrupt_kills_at_once(launch, tmp_path):
    m = marker()
    cmd = ["sh", "-c", f"trap '' INT TERM; sleep {m}; true"]
    r = launch(write_config(tmp_path, roles(2, cmd, 'stop = { signal = "SIGINT", grace = "30s" }')))
    r.wait_for_log("all 2 processes are running")
    r.signal(signal.SIGINT)
    r.wait_for_log("STOPPING")
    r.signal(signal.SIGINT)
    r.wait_for_log("received SIGINT again: killing every process now")
    # r.wait's timeout (20 s) is shorter than the 30 s grace: a stop that waited for the grace fails here.
    assert r.wait(timeout=20) == 130
    assert r.count_in_log("still running after its grace") == 0
    # 1 s: 10x what the guardian and PR_SET_PDEATHSIG need (test_adversarial_proc measures it).
    assert wait_until(lambda: not alive_with_marker(m), 1.0)


def test_torch_record_error_file_lands_in_the_summary(launch, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    raise ValueError('tapped layer 64 does not exist')\n"
        "main()\n")
    r = launch(write_config(tmp_path, roles(1, [sys.executable, str(script)])))
    assert r.wait() == 1
    s = r.summary()
    ef = s["processes"][0]["error_file"]
    assert ef and "ValueError: tapped layer 64 does not exist" in ef["message"]["message"]
    assert "tapped layer 64 does not exist" in s["reason"]


def test_supervisor_tells_systemd_when_all_are_running(launch, tmp_path):
    m = marker()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(20)
    r = launch(write_config(tmp_path, roles(2, ["sleep", m])), env=dict(os.environ, NOTIFY_SOCKET=path))
    msg = sock.recv(4096).decode()
    assert "READY=1" in msg and "all 2 processes running" in msg
    r.signal(signal.SIGTERM)
    r.wait()
    assert "STOPPING=1" in sock.recv(4096).decode()


def test_every_transition_is_logged(launch, tmp_path):
    r = launch(write_config(tmp_path, roles(1, ["sh", "-c", "exit 4"],
            'restart = { policy = "on-failure", max = 1, window = "1h", backoff = "50ms..50ms" }')))
    assert r.wait() == 4
    log = (r.run_dir / "supervisor.log").read_text()
    for t in ["STARTING -> RUNNING", "RUNNING -> BACKOFF", "STARTING (pid", "RUNNING -> FATAL"]:
        assert t in log, t


WRITER = r'''
import os, random, sys
name = os.environ["DFLASH_PROCESS"]
def lines(seed, n, tail, tag):
    rnd = random.Random(seed)
    out = [("%s %s %d " % (name, tag, i)) + "x" * rnd.randrange(1, 300) for i in range(n)]
    return "\n".join(out) + ("\n" if tail else "")
rank = int(os.environ["RANK"])
out, err = lines(rank, 100000, rank % 2 == 0, "O"), lines(1000 + rank, 10000, True, "E")
for i in range(0, len(out), 65536):
    os.write(1, out[i:i + 65536].encode())
os.write(2, err.encode())
'''


def expected(name, rank):
    import random as _random

    def lines(seed, n, tail, tag):
        rnd = _random.Random(seed)
        out = [("%s %s %d " % (name, tag, i)) + "x" * rnd.randrange(1, 300) for i in range(n)]
        return "\n".join(out) + ("\n" if tail else "")
    return lines(rank, 100000, rank % 2 == 0, "O"), lines(1000 + rank, 10000, True, "E")


def test_every_log_line_reaches_the_files_and_a_slow_console_blocks_nobody(bin_dir, tmp_path):
    import subprocess
    cfg = write_config(tmp_path, f'\n[[role]]\nname = "w"\ncpu = 8\ncommand = {json.dumps([sys.executable, "-c", WRITER])}\n')
    # The console is a pipe nobody reads until every payload has finished.
    # --no-dedup: the console's per-stream order and skip notices are the subject, not lines said alike.
    p = subprocess.Popen([str(bin_dir / "dflash-launch"), "run", str(cfg), "--run-id", "logs", "--no-dedup"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        log = tmp_path / "runs/logs/supervisor.log"
        assert wait_until(lambda: log.exists() and log.read_text().count("-> EXITED") == 8, 60), \
            "payloads were blocked by the unread console"
        console = p.stdout.read().decode()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for rank in range(8):
        name = f"w:{rank}"
        want_out, want_err = expected(name, rank)
        assert (tmp_path / f"runs/logs/attempt_0/w-{rank}.stdout.log").read_text() == want_out
        assert (tmp_path / f"runs/logs/attempt_0/w-{rank}.stderr.log").read_text() == want_err
    # On the console: whole lines with the right prefix, in order per stream;
    # what did not fit was skipped, and the console says so.
    last = {}
    shown = 0
    for line in console.splitlines():
        if not line.startswith("[w:"):
            continue
        prefix, _, text = line.partition("] ")
        name = prefix[1:]
        who, tag, i, body = text.split(" ", 3)
        assert who == name and set(body) == {"x"}, line[:80]
        i = int(i)
        assert i > last.get((name, tag), -1), line[:80]
        last[(name, tag)] = i
        shown += 1
    assert shown > 0
    if shown < 8 * 110000:
        assert "console too slow" in console and "skipped" in console

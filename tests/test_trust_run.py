"""Trust, second round, for what a run writes and reads (issue #38 items 5 and 6): an attempt log that cannot be
opened is a loud warning, never a SIGPIPE for the payload; a resumed run's files must be its own; another
user's symlinks at every port lock (issue #46 item 5) do not stop a run; another user squatting the default
spool dir does not block the config's runs; the run token is in no argv (issue #46 item 6)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import run
from supervise import Run, wait_until, write_config

NOBODY = 65534

# Attempt 0 swaps attempt_1..attempt_9 of its run dir for plain files (a cleanup job, a full inode table, a
# careless user: the next attempts' logs cannot be opened), then fails; attempt 1 writes 2000 lines and succeeds.
SWAPPER = r"""
import os, sys
run_dir, attempt = os.environ["DFLASH_RUN_DIR"], int(os.environ["DFLASH_ATTEMPT"])
if attempt == 0:
    for k in range(1, 10):
        open(os.path.join(run_dir, f"attempt_{k}"), "w").close()
    sys.exit(3)
for i in range(2000):
    print(f"line {i} of attempt {attempt}")
sys.stderr.write("and a word on stderr\n")
"""


def test_a_log_that_cannot_be_opened_is_a_warning_and_the_payload_runs_on(bin_dir, tmp_path):
    """Before: the pipe of a process whose log could not be opened was closed, so its first write killed it with
    SIGPIPE; every restart did the same, the budget burned, the run ended 141 and summary.json said nothing of
    the logs. Now: the pipe is drained to the console, the attempt succeeds, the run ends 0, and the console,
    supervisor.log and summary.json's warnings say which log could not be opened and why."""
    (tmp_path / "swap.py").write_text(SWAPPER)
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "swap.py"))}]
        restart = {{ policy = "on-failure", max = 3, window = "1h", backoff = "100ms..100ms" }}
        """)
    r = Run(bin_dir, config, "ll")
    rc = r.wait()
    said = r.out + r.err
    assert rc == 0, said
    log = (r.run_dir / "attempt_1/p-0.stdout.log")
    assert "cannot log to " + str(log) in said and "shown on the console only" in said, said
    assert "[p:0] line 1999 of attempt 1" in said and "[p:0] and a word on stderr" in said  # nothing lost
    summary = r.summary()
    assert [p["attempts"][-1]["exit_code"] for p in summary["processes"]] == [0], summary
    warnings = " ".join(summary["warnings"])
    assert f"p:0: cannot log to {log}" in warnings and "p-0.stderr.log" in warnings, summary["warnings"]
    assert "cannot log to" in (r.run_dir / "supervisor.log").read_text()


# ---- item 6 ----

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files and processes of another user")


def as_nobody(args, **kw):
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *args], **kw)


@needs_root
@pytest.mark.parametrize("how", ["another user's", "a hard link"])
def test_resume_refuses_a_history_that_is_not_its_own(bin_dir, tmp_path, how):
    """Before: `--resume` of a run dir whose events.jsonl was another user's (or a hard link to a file elsewhere)
    ran the payload, could not write its events and went on without them (exit 0). Now: exit 73 before anything
    starts, naming the file; the file and the payload's marker unchanged."""
    marker = tmp_path / "ran"
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["sh", "-c", "echo $DFLASH_ATTEMPT >> {marker}"]
        """)
    assert Run(bin_dir, config, "rs").wait() == 0
    events = tmp_path / "runs/rs/events.jsonl"
    if how == "a hard link":
        secret = tmp_path / "root-secret"
        secret.write_text("root's own\n")
        events.unlink()
        os.link(secret, events)
    else:
        os.chown(events, NOBODY, NOBODY)
    before = events.read_bytes()
    r = Run(bin_dir, config, "rs", args=["--resume"])
    assert r.wait() == 73, r.out + r.err
    assert "cannot resume run rs" in r.err and "events.jsonl" in r.err and "nothing was started" in r.err, r.err
    assert marker.read_text() == "0\n"  # attempt 0 only: the resume started nothing
    assert events.read_bytes() == before


def pid_reused_as(target, argv, tries=200):
    """Starts argv so that it gets pid `target` (ns_last_pid: root only), or returns None."""
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(target - 1))
        except OSError:
            return None
        p = subprocess.Popen(argv, start_new_session=True)
        if p.pid == target:
            return p
        p.kill()
        p.wait()
    return None


# A payload that claims its own child as MAINPID (a true claim), reaps it when it dies, and stays until "go".
CLAIMER = r"""
import os, pathlib, socket, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
addr = os.environ["NOTIFY_SOCKET"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(f"MAINPID={child.pid}\n".encode(), "\0" + addr[1:] if addr.startswith("@") else addr)
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
while not os.path.exists(sys.argv[2]):
    child.poll()
    time.sleep(0.02)
"""


@needs_root
def test_ctl_status_never_shows_or_measures_a_reused_mainpid(bin_dir, tmp_path):
    """The payload's claimed MAINPID (its child) ends, and its pid is given to a stranger holding 200 MiB. Before:
    `ctl status` showed the stranger as the payload and its RSS as the payload's. Now: payload_pid -1, and what
    is measured is the process itself."""
    claimed, go = tmp_path / "claimed", tmp_path / "go"
    (tmp_path / "claim.py").write_text(CLAIMER)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "claim.py"))}, "{claimed}", "{go}"]
        """)
    r = Run(bin_dir, config, "mp", env=env)
    stranger = None
    try:
        assert wait_until(lambda: claimed.exists() and claimed.read_text() or r.proc.poll() is not None)
        child = int(claimed.read_text())

        def status():
            st = run([bin_dir / "dflash-launch", "ctl", "mp", "status", "--json"], env=env)
            assert st.returncode == 0, st.stderr
            return json.loads(st.stdout)["processes"][0]

        assert wait_until(lambda: status()["payload_pid"] == child)
        os.kill(child, 9)
        assert wait_until(lambda: not os.path.exists(f"/proc/{child}"))  # reaped by the payload
        stranger = pid_reused_as(child, [sys.executable, "-c",
                                         "b = b'x' * (200 << 20); import time; time.sleep(300)"])
        if stranger is None:
            pytest.skip("could not hand the pid to another process (ns_last_pid)")
        assert wait_until(lambda: int(open(f"/proc/{child}/statm").read().split()[1]) * 4096 > 150 << 20)
        p = status()
        assert p["payload_pid"] == -1, p
        assert p["rss_bytes"] < 100 << 20, p  # the payload's own RSS, not the stranger's 200 MiB
    finally:
        go.touch()
        if stranger:
            stranger.kill()
            stranger.wait()
        r.wait(timeout=60)


# Another user (nobody) plants a symlink at every <port>.lock of the directories given.
PLANT = r"""
import os, sys
for d in sys.argv[1:]:
    for port in range(20000, 32767):
        try:
            os.symlink("/etc/passwd", f"{d}/{port}.lock")
        except OSError:
            pass
print("planted", flush=True)
"""


@needs_root
def test_symlinks_at_every_port_lock_and_a_squatted_lock_dir_do_not_stop_a_run(bin_dir, tmp_path):
    """Issue #46 item 5. Another user plants a symlink at every <port>.lock of the shared /tmp/dflash-ports, and
    makes the launcher's per-user /tmp/dflash-ports-<uid> first, full of symlinks too. Before: every run failed
    before it started (exit 73: "cannot reserve ports: open(...): Too many levels of symbolic links") although
    every port was free. Now: port locks are only in a directory of the user's own that nobody else can write;
    the squatted one is skipped with a warning naming its owner, and the run draws its ports and ends 0.
    In a mount namespace of its own, so other runs on this host never see the planted directories."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    shared, squat, xdg = tmp_path / "shared", tmp_path / "squat", tmp_path / "xdg"
    shared.mkdir()
    shared.chmod(0o1777)  # as the old launcher made /tmp/dflash-ports
    squat.mkdir()
    os.chown(squat, NOBODY, NOBODY)
    xdg.mkdir(mode=0o700)
    config = write_config(tmp_path, '[[role]]\nname = "p"\ncpu = 1\nports = ["http"]\ncommand = ["true"]\n')
    own = f"/tmp/dflash-ports-{os.geteuid()}"
    os.makedirs(own, mode=0o700, exist_ok=True)  # a mount point; what the launcher makes anyway
    os.makedirs("/tmp/dflash-ports", exist_ok=True)
    script = (f"set -e; mount --bind {shared} /tmp/dflash-ports; mount --bind {squat} {own}; "
              f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {sys.executable} -c \"$PLANT\" "
              f"/tmp/dflash-ports {own}; "
              f"exec {bin_dir}/dflash-launch run {config} --run-id lk46 --color never")
    r = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env=dict(os.environ, PLANT=PLANT, XDG_RUNTIME_DIR=str(xdg)), timeout=120)
    said = r.stdout + r.stderr
    assert "planted" in said, said
    assert len(os.listdir(shared)) > 12000 and len(os.listdir(squat)) > 12000  # the attack was staged
    assert r.returncode == 0, said
    assert f"{own} is nobody's (uid {NOBODY}), not yours" in said, said
    locks = [n for n in os.listdir(xdg / "dflash-ports") if n.endswith(".lock")]
    assert locks and (xdg / "dflash-ports").stat().st_mode & 0o777 == 0o700, locks
    summary = json.loads((tmp_path / "runs/lk46/summary.json").read_text())
    assert f"{summary['processes'][0]['ports']['http']}.lock" in locks, summary["processes"][0]


def test_the_run_token_is_in_no_argv_of_the_guardian(bin_dir, tmp_path):
    """Issue #46 item 6. Before: `dflash-guardian TOKEN`, readable by every user in /proc/<pid>/cmdline. Now: it
    gets DFLASH_RUN_TOKEN in its environment (readable by the run's user only), and still kills the run's
    processes when the launcher is SIGKILLed."""
    from supervise import proc_table
    marker = tmp_path / "payload.pid"
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["sh", "-c", "echo $$ > {marker}; exec sleep 300"]
        """)
    r = Run(bin_dir, config, run_id="tok46")
    try:
        assert wait_until(lambda: marker.exists() and marker.read_text().strip())
        guardians = [pid for pid, (ppid, state, cmd) in proc_table().items()
                     if ppid == r.pid and "dflash-guardian" in cmd and state != "Z"]
        assert len(guardians) == 1, proc_table()
        g = guardians[0]
        payload = int(marker.read_text())
        token = dict(e.split(b"=", 1) for e in open(f"/proc/{payload}/environ", "rb").read().split(b"\0") if b"=" in e)
        token = token[b"DFLASH_RUN_TOKEN"]
        assert len(token) >= 16, token
        argv = open(f"/proc/{g}/cmdline", "rb").read()
        assert token not in argv, argv
        assert argv.split(b"\0")[:-1] == [str(bin_dir / "dflash-guardian").encode()], argv
        genv = open(f"/proc/{g}/environ", "rb").read().split(b"\0")
        assert b"DFLASH_RUN_TOKEN=" + token in genv
        assert os.stat(f"/proc/{g}/environ").st_mode & 0o077 == 0  # others cannot read it
        r.signal(9)  # the guardian's job: nothing of the run outlives the launcher
        r.wait(timeout=60)
        assert wait_until(lambda: not os.path.exists(f"/proc/{payload}") or
                          open(f"/proc/{payload}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", timeout=30)
    finally:
        if r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()


@needs_root
def test_a_squatted_default_spool_dir_does_not_block_the_config(bin_dir, tmp_path):
    """Another user makes /dev/shm/dflash-<uid>-<name> first. Before: every run of that config was a config error
    (exit 2), spool or not. Now: a warning names the squatter and an unguessable dir is used instead; the run
    ends 0 and the squatter's dir is untouched."""
    name = "sq" + uuid.uuid4().hex[:8]
    squat = pathlib.Path(f"/dev/shm/dflash-{os.geteuid()}-{name}")
    made = as_nobody(["mkdir", "-m", "0777", str(squat)])
    assert made.wait() == 0
    seen = tmp_path / "spool-env"
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 1
        command = ["sh", "-c", "echo $DFLASH_SPOOL_DIR > {seen}"]
        """, name=name)
    try:
        c = run([bin_dir / "dflash-launch", "check", config])
        assert c.returncode == 0, c.stdout + c.stderr
        assert "warning: run.spool_dir" in c.stderr and "owned by nobody" in c.stderr, c.stderr
        r = Run(bin_dir, config, "sq")
        assert r.wait() == 0, r.out + r.err
        used = seen.read_text().strip()
        assert used.startswith(f"{squat}-") and "/sq" in used, used
        assert os.stat(squat).st_uid == NOBODY and not os.listdir(squat)
    finally:
        shutil.rmtree(squat, ignore_errors=True)
        for d in pathlib.Path("/dev/shm").glob(f"dflash-{os.geteuid()}-{name}-*"):
            shutil.rmtree(d, ignore_errors=True)

"""A payload's notify messages are claims (issue #21, part 1): a MAINPID= that names a process outside the tree
the supervisor started is ignored with a warning, so nothing is killed, signalled or measured by it. Before the
fix, MAINPID=1 from a payload that exited made the supervisor kill(-1, SIGKILL): every process of its pid
namespace died and the run said "all processes succeeded"."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import run
from supervise import wait_until, write_config

# A payload that sends `MAINPID=<argv[1]>` on $NOTIFY_SOCKET (stdlib only), then waits for `argv[2]` to appear
# (or exits at once without it). argv[1] "child" claims a child of its own: a true claim.
CLAIM = textwrap.dedent("""\
    import os, socket, subprocess, sys, time
    pid = sys.argv[1]
    child = None
    if pid == "child":
        child = subprocess.Popen(["sleep", "300"])
        pid = str(child.pid)
    addr = os.environ["NOTIFY_SOCKET"]
    if addr.startswith("@"):
        addr = "\\0" + addr[1:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(f"MAINPID={pid}\\n".encode(), addr)
    print("claimed", pid, flush=True)
    while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    """)


def claim_config(tmp_path, claim, go=None):
    script = tmp_path / "claim.py"
    script.write_text(CLAIM)
    cmd = [sys.executable, str(script), str(claim)] + ([str(go)] if go else [])
    return write_config(tmp_path, f'\n[[role]]\nname = "p"\ncpu = 1\ncommand = {json.dumps(cmd)}\n')


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")
@pytest.mark.parametrize("cgroup", ["auto", "off"])
def test_mainpid_1_from_a_payload_kills_nothing_in_its_pid_namespace(bin_dir, tmp_path, cgroup):
    """In a pid namespace of its own (so a kill(-1) cannot escape the test): three bystanders in sessions of
    their own, then a run whose payload claims MAINPID=1 and exits. The bystanders live; the claim is named."""
    cfg = claim_config(tmp_path, 1)
    script = textwrap.dedent(f"""\
        for k in 1 2 3; do setsid sleep 300 & pids="$pids $!"; done
        DFLASH_CGROUP={cgroup} {bin_dir}/dflash-launch run {cfg} --run-id r --plain; echo "rc=$?"
        alive=0
        for p in $pids; do  # a killed bystander is a zombie of this shell until it waits: read its state
          s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && alive=$((alive+1))
        done
        echo "alive=$alive"
        """)
    r = run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script], timeout=120)
    out = r.stdout + r.stderr
    assert "alive=3" in out, out
    assert "rc=0" in out, out  # the payload did exit 0; what it claimed changed nothing
    log = (tmp_path / "runs" / "r" / "supervisor.log").read_text()
    assert "MAINPID=1 names no process of its own: ignored" in log, log


def test_a_claim_on_an_unrelated_process_is_ignored_it_is_never_killed_or_measured(bin_dir, launch, tmp_path):
    """MAINPID=<a process of somebody else, leading its own group>: `ctl status` does not show it as the payload,
    and the end of the payload (which kills the payload's group) leaves it alive."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    go = tmp_path / "go"
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    try:
        r = launch(claim_config(tmp_path, bystander.pid, go), env=env)
        r.wait_for_log("is not in the process tree the supervisor started")
        st = run([bin_dir / "dflash-launch", "ctl", "r", "status", "--json"], env=env)
        assert st.returncode == 0, st.stderr
        (p,) = json.loads(st.stdout)["processes"]
        assert p["payload_pid"] == -1 and p["pid"] != bystander.pid, p
        go.write_text("")
        assert r.wait(timeout=60) == 0, r.err
        assert bystander.poll() is None, "the bystander was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_true_claim_on_a_child_of_the_payload_is_taken(bin_dir, launch, tmp_path):
    """The same message naming the payload's own child is believed: ctl status shows that pid, and the end of
    the run takes the child with it."""
    go = tmp_path / "go"
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    r = launch(claim_config(tmp_path, "child", go), env=env)
    log = r.run_dir / "attempt_0" / "p-0.stdout.log"
    # The whole line: an unbuffered print() reaches the log in pieces ("claimed", " ", pid, "\n").
    assert wait_until(lambda: log.exists() and re.search(r"claimed (\d+)\n", log.read_text()))
    child = int(re.search(r"claimed (\d+)\n", log.read_text()).group(1))

    def shown():
        st = run([bin_dir / "dflash-launch", "ctl", "r", "status", "--json"], env=env)
        return st.returncode == 0 and json.loads(st.stdout)["processes"][0]["payload_pid"] == child

    assert wait_until(shown)
    r.signal(signal.SIGTERM)
    assert r.wait(timeout=60) == 128 + signal.SIGTERM, r.err
    assert wait_until(lambda: not os.path.exists(f"/proc/{child}") or
                      open(f"/proc/{child}/stat").read().split(")")[1].split()[0] == "Z")
    assert "ignored" not in (r.run_dir / "supervisor.log").read_text()

"""dflash-launch ctl / ps / logs against a live run of real processes (issue #13):
5 targets and 3 drafters of tests/payloads/ctl_step.py, steered over the run's
control socket while they run."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import pytest

from conftest import run
from supervise import Run, wait_until, write_config

PAYLOAD = pathlib.Path(__file__).parent / "payloads" / "ctl_step.py"


def eight_roles(step_s="0.5", steps=0):
    cmd = json.dumps([sys.executable, str(PAYLOAD)])
    env = f'env = {{ STEP_S = "{step_s}", STEPS = "{steps}" }}'
    return f"""
[[role]]
name = "target"
devices = [0, 1, 2, 3, 4]
command = {cmd}
ready = "notify"
{env}
stop = {{ grace = "5s" }}

[[role]]
name = "drafter"
devices = [5, 6, 7]
command = {cmd}
ready = "notify"
{env}
stop = {{ grace = "5s" }}
"""


class Live:
    """One 8-process run shared by the tests of this module (each start costs
    seconds on a busy machine), with its own run registry (XDG_RUNTIME_DIR)."""

    def __init__(self, bin_dir, tmp):
        self.bin = bin_dir / "dflash-launch"
        xdg = tmp / "xdg"
        xdg.mkdir(mode=0o700)
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
        self.run = Run(bin_dir, write_config(tmp, eight_roles()), run_id="ctl-test", env=self.env)

    def ctl(self, *args, timeout=30):
        return run([self.bin, "ctl", "ctl-test", *args], env=self.env, timeout=timeout)

    def status(self):
        r = self.ctl("status", "--json")
        assert r.returncode == 0, r.stderr
        return {p["name"]: p for p in json.loads(r.stdout)["processes"]}

    def wait_status(self, pred, timeout=60):
        """Until pred(status by name) holds; the status then."""
        last = {}

        def check():
            nonlocal last
            r = self.ctl("status", "--json")
            if r.returncode != 0:
                return False
            last = {p["name"]: p for p in json.loads(r.stdout)["processes"]}
            return pred(last)

        assert wait_until(check, timeout=timeout, step=0.1), json.dumps(last, indent=1)
        return last


@pytest.fixture(scope="module")
def live(bin_dir, tmp_path_factory):
    lv = Live(bin_dir, tmp_path_factory.mktemp("ctl"))
    try:
        lv.wait_status(lambda s: len(s) == 8 and all(p["state"] == "RUNNING" for p in s.values()))
        yield lv
    finally:
        lv.run.kill()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"


def test_status_json_on_a_live_eight_process_run(live):
    s = live.wait_status(lambda s: all(p["status"].startswith("step ") for p in s.values()))
    assert sorted(s) == [f"drafter:{i}" for i in range(3)] + [f"target:{i}" for i in range(5)]
    for name, p in s.items():
        assert p["state"] == "RUNNING" and pid_alive(p["pid"]), p
        assert p["gpu"] == str(int(name.split(":")[1]) + (5 if name.startswith("drafter") else 0))
        assert p["rss_bytes"] > 0 and p["cpu_percent"] >= 0  # sampled from /proc by ctl
    text = live.ctl("status")
    assert text.returncode == 0, text.stderr
    rows = [l for l in text.stdout.splitlines() if l.startswith(("target:", "drafter:"))]
    assert len(rows) == 8 and all(" RUNNING " in r for r in rows), text.stdout


def test_restart_drafter_keeps_the_targets_pids_and_uptime(live):
    before = live.status()
    r = live.ctl("restart", "drafter")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "restart drafter:0, drafter:1, drafter:2"
    old = {n: before[n]["pid"] for n in before if n.startswith("drafter")}
    after = live.wait_status(lambda s: all(
        s[n]["state"] == "RUNNING" and s[n]["pid"] not in (-1, old[n]) for n in old))
    for n in old:
        assert not pid_alive(old[n])
        # Asked by hand: a restart, by ctl, never counted against the restart budget (own failures only).
        by, was = after[n]["restarts_by"], before[n]["restarts_by"]
        assert by == dict(was, ctl=was["ctl"] + 1) and by["own"] == 0, (n, by, was)
        assert after[n]["restarts"] == before[n]["restarts"] + 1 == sum(by.values()), after[n]
    for n in before:
        if n.startswith("target"):
            assert after[n]["pid"] == before[n]["pid"] and after[n]["state"] == "RUNNING"
            assert 0 < before[n]["uptime_s"] < after[n]["uptime_s"]  # never restarted: its clock runs on


def test_stop_one_drafter_then_start_it(live):
    before = live.status()
    r = live.ctl("stop", "drafter:1")
    assert r.returncode == 0, r.stderr
    old = before["drafter:1"]["pid"]
    s = live.wait_status(lambda s: s["drafter:1"]["state"] != "RUNNING" and s["drafter:1"]["held"]
                         and not pid_alive(old))
    assert all(s[n]["state"] == "RUNNING" for n in s if n != "drafter:1")  # the run goes on
    assert live.run.proc.poll() is None
    r = live.ctl("start", "drafter:1")
    assert r.returncode == 0, r.stderr
    s = live.wait_status(lambda s: s["drafter:1"]["state"] == "RUNNING" and not s["drafter:1"]["held"])
    assert s["drafter:1"]["pid"] != old and pid_alive(s["drafter:1"]["pid"])


def test_signal_reaches_only_its_target(live):
    r = live.ctl("signal", "USR1", "drafter:2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "signal drafter:2 (SIGUSR1)"
    assert wait_until(lambda: "drafter:2: got SIGUSR1" in live.ctl("logs", "drafter:2").stdout)
    assert "got SIGUSR1" not in live.ctl("logs", "target").stdout
    r = live.ctl("signal", "NOPE", "drafter:2")
    assert r.returncode == 64 and 'unknown signal "NOPE"' in r.stderr


def test_unknown_target_and_unknown_run_have_their_own_exit_codes(live):
    r = live.ctl("restart", "drafters")
    assert r.returncode == 67
    assert 'no role or process "drafters"; the run has: target, drafter (or all)' in r.stderr
    r = live.ctl("stop", "drafter:9")
    assert r.returncode == 67 and "drafter has ranks 0, 1, 2" in r.stderr
    r = run([live.bin, "ctl", "no-such-run", "status"], env=live.env)
    assert r.returncode == 66 and "no live run no-such-run" in r.stderr


def test_a_mode_0777_socket_is_refused(live):
    sock = live.run.run_dir / "control.sock"
    os.chmod(sock, 0o777)
    try:
        r = live.ctl("stop", "all")
        assert r.returncode == 77, r.stderr
        assert "mode 0777" in r.stderr
    finally:
        os.chmod(sock, 0o600)
    assert all(p["state"] == "RUNNING" for p in live.status().values())  # nothing was stopped


def test_silent_and_hostile_clients_do_not_stall_the_run(live):
    sock = str(live.run.run_dir / "control.sock")
    silent, partial, big = (socket.socket(socket.AF_UNIX) for _ in range(3))
    try:
        for c in (silent, partial, big):
            c.connect(sock)
        partial.sendall(b'{"verb": "sta')        # half a request, never finished
        big.settimeout(10)
        try:
            big.sendall(b"x" * 100000)           # no newline, far over the limit
        except OSError:
            pass                                 # the run stopped reading it: that is the point
        # The run answers others and keeps running its processes.
        before = live.status()
        s = live.wait_status(lambda s: all(s[n]["status"] != before[n]["status"] for n in s))
        assert all(p["state"] == "RUNNING" for p in s.values())
        reply = big.recv(4096)
        assert b"longer than 4096 bytes" in reply
    finally:
        for c in (silent, partial, big):
            c.close()


def test_a_request_with_a_key_twice_is_refused_and_restarts_nothing(live):
    """{"verb":"status","verb":"restart"}: a parser that keeps the last key read a restart of everything."""
    before = live.status()
    for line in (b'{"verb":"status","verb":"restart","target":"all"}\n',
                 b'{"verb":"restart","target":"drafter:0","target":"all"}\n'):
        with socket.socket(socket.AF_UNIX) as c:
            c.settimeout(30)
            c.connect(str(live.run.run_dir / "control.sock"))
            c.sendall(line)
            reply = json.loads(c.makefile().readline())
        assert reply["ok"] is False and "appears twice" in reply["error"], reply
    # A request the run does act on comes after them: had either restarted anything, it shows by now.
    after = live.wait_status(lambda s: all(s[n]["status"] != before[n]["status"] for n in s))
    for n, p in before.items():
        assert after[n]["pid"] == p["pid"] and after[n]["restarts_by"] == p["restarts_by"], (n, after[n])


def test_ps_lists_the_run(live):
    r = run([live.bin, "ps", "--json"], env=live.env)
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert [(x["run_id"], x["pid"], x["running"], x["total"]) for x in runs] == [("ctl-test", live.run.pid, 8, 8)]
    assert runs[0]["run_dir"] == str(live.run.run_dir.resolve())
    r = run([live.bin, "ps"], env=live.env)
    assert "ctl-test" in r.stdout and " 8/8 " in r.stdout


def test_logs_shows_a_process_output(live):
    r = live.ctl("logs", "target:0")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(l.startswith("target:0: step ") for l in lines), r.stdout
    r = live.ctl("logs", "drafter")  # several processes: each line says whose
    assert r.returncode == 0 and "[drafter:2] drafter:2: step " in r.stdout


def test_logs_follow_ends_with_the_run_and_the_socket_and_entry_go(live):
    f = subprocess.Popen([str(live.bin), "ctl", "ctl-test", "logs", "-f", "target:3"], env=live.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Following: its first line is out (returns "" if it exited instead).
        first = f.stdout.readline()
        assert first.startswith("target:3: step "), (first, f.poll())
        live.run.signal(signal.SIGTERM)
        assert live.run.wait() == 128 + signal.SIGTERM
        out, err = f.communicate(timeout=30)  # it ends by itself once the run has
        out = first + out
    finally:
        f.kill()
    assert f.returncode == 0, err
    assert "target:3: step 1 " in out
    assert not (live.run.run_dir / "control.sock").exists()
    r = run([live.bin, "ps", "--json"], env=live.env)
    assert json.loads(r.stdout) == []
    r = live.ctl("status")
    assert r.returncode == 66

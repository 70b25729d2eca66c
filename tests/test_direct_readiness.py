"""Readiness of processes the supervisor runs itself (no dflash-worker in between: ungated, ready = none,
notify or exit) is judged by the same rules as the worker's (contract/readiness.h)."""
import json
import os
import signal
import sys

from supervise import write_config

ENV = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


def role(command, ready, n=1):
    return f"""
[[role]]
name = "p"
cpu = {n}
command = {json.dumps(command)}
cwd = "."
ready = {ready}
"""


def test_a_direct_process_not_ready_in_time_fails_with_75_and_says_why(launch, tmp_path):
    r = launch(write_config(tmp_path, role(["sleep", "30"], '{ mode = "notify", timeout = "500ms" }')))
    assert r.wait(timeout=60) == 75, r.err
    s = r.summary()
    assert s["culprit"] == "p:0"
    assert "p:0 (pid" in s["reason"]
    assert "not ready after 500ms (ready = notify: no READY=1 received)" in s["reason"], s["reason"]


def test_a_direct_notify_process_is_ready_on_ready1(launch, tmp_path):
    say = "from dflash_launch import notify_ready; notify_ready('warm')"
    cmd = ["sh", "-c", f"{sys.executable} -c \"{say}\"; exec sleep 30"]
    r = launch(write_config(tmp_path, role(cmd, '{ mode = "notify", timeout = "60s" }')), env=ENV)
    r.wait_for_log("RUNNING")  # ready: READY=1 from a child in its process group counts
    assert r.state_of("p:0") == "RUNNING"
    r.signal(signal.SIGTERM)
    assert r.wait(timeout=60) == 128 + signal.SIGTERM, r.err
    assert "not ready" not in r.summary()["reason"]


def test_a_direct_exit_process_that_fails_is_not_ready(launch, tmp_path):
    r = launch(write_config(tmp_path, role(["sh", "-c", "exit 3"], '{ mode = "exit", timeout = "60s" }')))
    assert r.wait(timeout=60) == 3, r.err
    s = r.summary()
    assert s["culprit"] == "p:0" and s["processes"][0]["exit_code"] == 3

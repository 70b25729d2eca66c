"""A payload's files never stall or kill the supervisor (issue #55, item 7). The supervisor reads a process's
DFLASH_METRICS_FILE (every 2 s for the live metrics, on `ctl metrics`, at the end) and its TORCHELASTIC_ERROR_FILE
(when it exits) on its loop thread. Before the fix a payload that made either a FIFO wedged the loop (`ctl` hung,
SIGTERM was never taken, only SIGKILL ended the run) and one that made it a link to /dev/zero ended the launcher
in std::bad_alloc (exit 134, no summary). Now such a file is "unreadable (why)" in summary.json and the console,
and the run is steered and ends as if the payload had written nothing."""
import json
import os
import signal
import sys
import textwrap
import time

import pytest

from conftest import run
from supervise import wait_until, write_config

# The payload: replaces the file its env names (argv[1]) by argv[2] ("fifo", "fifo_held": a FIFO it holds open
# for writing and never writes, "zero": a link to /dev/zero, "deep": a JSON object nested 150000 levels, 0.9 MB:
# the summary's dump of it overflowed the stack), says so, then waits for argv[3] to appear (or SIGTERM) and
# exits with argv[4].
PLANT = textwrap.dedent("""\
    import os, sys, time
    var, how, go, code = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    path = os.environ[var]
    if os.path.lexists(path):
        os.unlink(path)
    held = None
    if how.startswith("fifo"):
        os.mkfifo(path, 0o600)
        if how == "fifo_held":
            held = os.open(path, os.O_RDWR)  # a writer that never writes
    elif how == "zero":
        os.symlink("/dev/zero", path)
    elif how == "deep":
        with open(path, "w") as f:
            f.write('{"a":' * 150000 + "1" + "}" * 150000)
    print("planted", how, flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    sys.exit(code)
    """)

WHY = {"fifo": "a FIFO, not a regular file", "fifo_held": "a FIFO, not a regular file",
       "zero": "a symlink to /dev/zero: never followed", "deep": "JSON nested deeper than 64 levels"}


def planting_run(launch, tmp_path, var, how, code):
    script = tmp_path / "plant.py"
    script.write_text(PLANT)
    go = tmp_path / "go"
    cmd = [sys.executable, str(script), var, how, str(go), str(code)]
    cfg = write_config(tmp_path, f'''
        [[role]]
        name = "p"
        cpu = 1
        command = {json.dumps(cmd)}
        ready = {{ mode = "log", pattern = "^planted" }}
        stop = {{ grace = "5s" }}
        ''')
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    return launch(cfg, env=env), env, go


def ctl_answers(bin_dir, env, verb, within=5.0):
    """`ctl r <verb>` answers (exit 0) within `within` seconds: the loop is not stuck on a file."""
    t = time.monotonic()
    r = run([bin_dir / "dflash-launch", "ctl", "r", verb], env=env, timeout=within + 30)
    took = time.monotonic() - t
    assert r.returncode == 0, (verb, r.returncode, r.stdout, r.stderr)
    assert took < within, f"ctl {verb} took {took:.1f} s"
    return r.stdout


@pytest.mark.parametrize("how", ["fifo", "fifo_held", "zero", "deep"])
def test_a_metrics_file_replaced_by_a_fifo_or_a_link_leaves_the_run_steerable(bin_dir, launch, tmp_path, how):
    """The metrics file is read every 2 s while the payload runs: `ctl status` and `ctl metrics` (which reads it
    at once) still answer, SIGTERM still stops the run (143), and the summary says why the file was not read."""
    r, env, _go = planting_run(launch, tmp_path, "DFLASH_METRICS_FILE", how, 0)
    r.wait_for_log("all 1 processes are running")
    assert "p" in ctl_answers(bin_dir, env, "status")
    ctl_answers(bin_dir, env, "metrics")
    time.sleep(2.5)  # one more of the loop's own 2-s reads of the file (kMetricsPeriod)
    assert "p" in ctl_answers(bin_dir, env, "status")
    r.signal(signal.SIGTERM)
    assert r.wait(timeout=60) == 128 + signal.SIGTERM, r.err[-3000:]
    s = r.summary()
    p = s["processes"][0]
    assert p["metrics"] is None and p["metrics_unreadable"] == WHY[how], p
    assert p["error_file_unreadable"] is None
    warning = [w for w in s["warnings"] if "metrics file" in w]
    assert len(warning) == 1 and f"is unreadable ({WHY[how]})" in warning[0], s["warnings"]
    assert f"unreadable ({WHY[how]})" in r.out + r.err  # the console says it too


@pytest.mark.parametrize("how", ["fifo", "zero", "deep"])
def test_an_error_file_replaced_by_a_fifo_or_a_link_is_unreadable_and_the_run_ends(bin_dir, launch, tmp_path, how):
    """The error file is read when its process exits: the run ends with the payload's own exit code (3) and a
    summary, instead of hanging on the FIFO or aborting (134) on /dev/zero."""
    r, env, go = planting_run(launch, tmp_path, "TORCHELASTIC_ERROR_FILE", how, 3)
    r.wait_for_log("all 1 processes are running")
    go.touch()
    assert r.wait(timeout=60) == 3, (r.out[-3000:], r.err[-3000:])
    s = r.summary()
    p = s["processes"][0]
    assert p["exit_code"] == 3 and p["error_file"] is None and p["error_file_unreadable"] == WHY[how], p
    assert s["exit_code"] == 3 and "exited with code 3" in s["reason"], s["reason"]
    assert any(f"error file" in w and f"is unreadable ({WHY[how]})" in w for w in s["warnings"]), s["warnings"]
    assert f"unreadable ({WHY[how]})" in r.out + r.err

"""The watchdog (issue 13 part 3): a payload that stops sending WATCHDOG=1 is
killed with its watchdog_signal (SIGABRT: faulthandler dumps its stack into its
log), counted as a failure with reason "hung" and restarted by policy. Run
directly and under dflash-worker (which relays the payload's pings)."""
import os
import sys

import pytest

from conftest import ROOT
from supervise import write_config

PINGER = ROOT / "tests" / "payloads" / "watchdog_pinger.py"


@pytest.mark.parametrize("ready", ['"none"', '{ mode = "log", pattern = "pinging" }'], ids=["direct", "worker"])
def test_a_payload_that_stops_pinging_is_hung_killed_and_restarted(launch, tmp_path, ready):
    config = write_config(tmp_path, f"""
[[role]]
name = "w"
cpu = 1
command = ["{sys.executable}", "{PINGER}"]
ready = {ready}
watchdog = "5s"  # 10x the longest gap a loaded machine puts between two 0.1 s pings
restart = {{ policy = "on-failure", max = 2, window = "1h", backoff = "100ms..100ms" }}
stop = {{ grace = "5s" }}
""")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = launch(config, env=env)
    assert r.wait(timeout=120) == 0, r.err
    s = r.summary()
    p = s["processes"][0]
    assert len(p["attempts"]) == 2, p
    hung, second = p["attempts"]
    assert hung["hung"] is True and hung["outcome"] == "restarted", hung
    assert hung["reason"].startswith("hung: no WATCHDOG=1 for 5s"), hung
    assert hung["signal"] == "SIGABRT" and hung["exit_code"] == 134, hung
    assert second["exit_code"] == 0 and not second["hung"], second
    # faulthandler's dump: the frame it hung in, in attempt 0's stderr.
    err0 = (r.run_dir / "attempt_0" / "w-0.stderr.log").read_text()
    assert "Fatal Python error: Aborted" in err0, err0
    assert "stuck_in_collective" in err0, err0

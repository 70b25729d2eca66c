"""Restarts that fit torch.distributed (issue 13 part 4), with real processes in a
real gloo world: the culprit is the first failure of the incident even when that
one was restartable; a declared world restarts as one unit; `check` warns about
scope = "process" in one world; summary.json keeps every attempt; events.jsonl
has every transition."""
import json
import sys

from conftest import ROOT, run
from supervise import write_config

WORLD = ROOT / "tests" / "payloads" / "world_member.py"


def world_config(tmp_path, world_line, target_restart, steps=100000):
    """One gloo world of target:0, drafter:0 and drafter:1 (3 processes: each pays `import torch`, ~1.7 CPU-s)."""
    cmd = f'["{sys.executable}", "{WORLD}"]'
    env = f'env = {{ FAIL_PROCESS = "drafter:1", FAIL_CODE = "3", STEPS = "{steps}" }}'
    return write_config(tmp_path, f"""
[[role]]
name = "target"
cpu = 1
command = {cmd}
{env}
restart = {target_restart}
stop = {{ grace = "5s" }}
{world_line}

[[role]]
name = "drafter"
cpu = 2
command = {cmd}
{env}
restart = {{ policy = "on-failure", scope = "process", max = 3, window = "1h", backoff = "100ms..100ms" }}
stop = {{ grace = "5s" }}
{world_line}
""")


def events(r):
    return [json.loads(line) for line in (r.run_dir / "events.jsonl").read_text().splitlines()]


def test_one_world_scope_process_culprit_is_the_first_failure(launch, bin_dir, tmp_path):
    """The issue's case: one world over two roles, scope = "process", no world said.
    drafter:1 exits 3 and is restarted; its peers then fail with 1; the run names
    drafter:1 with exit 3, not the rank that failed last."""
    config = world_config(tmp_path, "", '{ policy = "never" }')
    c = run([bin_dir / "dflash-launch", "check", config])
    assert c.returncode == 0, c.stderr
    assert 'warning: role[drafter].restart.scope: scope = "process" for 2 processes whose torch world is not said' \
        in c.stderr, c.stderr
    r = launch(config)
    assert r.wait(timeout=180) == 3, r.err
    s = r.summary()
    assert s["format"] == "dflash-summary/2"
    assert s["culprit"] == "drafter:1" and s["culprit_attempt"] == 0, (s["culprit"], s["reason"])
    assert s["exit_code"] == 3
    by = {p["name"]: p for p in s["processes"]}
    first = by["drafter:1"]["attempts"][0]
    # Its restart came after a 100 ms backoff, unless its peers' failure came first (a loaded machine): then the
    # run stopped in the backoff, and nothing says "restarted" (the core's own test pins that order down).
    if len(by["drafter:1"]["attempts"]) > 1:
        assert s["reason"].startswith("drafter:1 exited with code 3 (attempt 0, restarted); then "), s["reason"]
        # The table marks the root cause's attempt, not its last one (stopped with the run).
        assert "<- culprit: exited with code 3 (attempt 0, restarted)" in r.out, r.out
        assert first["outcome"] == "restarted" and first["restarted"] is True, first
    else:
        assert s["reason"].startswith("drafter:1 exited with code 3; then "), s["reason"]
        assert "<- culprit: exited with code 3" in r.out and "restarted)" not in r.out, r.out
        assert first["outcome"] == "failed" and first["restarted"] is False, first
    assert first["exit_code"] == 3
    assert first["end_s"] >= first["start_s"] >= 0
    # A target failed after it (its peer was gone: exit 1, or gloo aborts): that
    # ended the run, but it is not the cause.
    failed = [p for n, p in by.items() if n.startswith("target") and p["attempts"][-1]["outcome"] == "failed"]
    assert failed and failed[0]["exit_code"] not in (0, 3), by
    assert not by["target:0"]["culprit"]
    # Every transition is an event; the root cause's is there with its exit code.
    ev = events(r)
    assert all({"time", "t", "process", "from", "to", "reason", "attempt", "manual"} <= e.keys()
               for e in ev if "to" in e), ev
    assert any(e["process"] == "drafter:1" and e.get("to") == "BACKOFF" and e.get("exit_code") == 3 for e in ev), ev


def test_a_declared_world_restarts_as_one_unit(launch, bin_dir, tmp_path):
    """world = "run": drafter:1's failure restarts all three ranks into a fresh world,
    which then finishes; nothing else fails. The drafters still say scope =
    "process": the world wins, and `check` says so."""
    config = world_config(tmp_path, 'world = "run"',
                          '{ policy = "on-failure", scope = "all", max = 3, window = "1h", backoff = "100ms..100ms" }',
                          steps=40)
    c = run([bin_dir / "dflash-launch", "check", config])
    assert c.returncode == 0, c.stderr
    assert ('role[drafter].restart.scope: scope = "process", but the 3 processes of its torch world '
            '(world = "run") restart together') in c.stderr, c.stderr
    assert "role[target]" not in c.stderr, c.stderr  # scope = "all": nothing to say
    r = launch(config)
    assert r.wait(timeout=180) == 0, r.err
    s = r.summary()
    for p in s["processes"]:
        assert len(p["attempts"]) == 2, p
        assert p["attempts"][1]["exit_code"] == 0 and p["attempts"][1]["outcome"] == "succeeded", p
    by = {p["name"]: p for p in s["processes"]}
    assert by["drafter:1"]["attempts"][0]["exit_code"] == 3
    # The others were stopped for the restart: no failure of theirs.
    for n in ("target:0", "drafter:0"):
        assert by[n]["attempts"][0]["outcome"] == "restarted", by[n]

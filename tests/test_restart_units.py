"""Restarts that fit torch.distributed (issue 13 part 4), with real processes in a
real gloo world: the culprit is the first failure of the incident even when that
one was restartable; a declared world restarts as one unit; `check` warns about
scope = "process" in one world; summary.json keeps every attempt; events.jsonl
has every transition."""
import json
import os
import re
import sys

from conftest import ROOT, run
from supervise import wait_until, write_config

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


def test_live_and_final_restart_counts_agree_with_their_reasons(launch, bin_dir, tmp_path):
    """One meaning of "restarts" (issue #59 item 5): a 3-rank gloo world whose rank 1 exits 3 once. While the
    restarted world runs, `ctl status`, the live view's cell, the metrics and, after `ctl stop all`, the final table
    and summary.json all say 1/1/1, each with why: drafter:1 its own failure, its peers their unit's restart
    (`ctl status` said 0/1/0 before: restarts charged to the budget, beside the summary's attempts)."""
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    cmd = f'["{sys.executable}", "{WORLD}"]'
    config = write_config(tmp_path, f"""
[[role]]
name = "drafter"
cpu = 3
command = {cmd}
env = {{ FAIL_PROCESS = "drafter:1", FAIL_CODE = "3", STEPS = "100000" }}
restart = {{ policy = "on-failure", scope = "process", max = 3, window = "1h", backoff = "100ms..100ms" }}
stop = {{ grace = "5s" }}
world = "role"
""")
    r = launch(config, env=env, run_id="counts")
    names = ["drafter:0", "drafter:1", "drafter:2"]
    want = {"drafter:0": {"own": 0, "unit": 1, "ctl": 0}, "drafter:1": {"own": 1, "unit": 0, "ctl": 0},
            "drafter:2": {"own": 0, "unit": 1, "ctl": 0}}
    ctl = [bin_dir / "dflash-launch", "ctl", "counts"]
    seen = {}

    def restarted_and_running():
        s = run([*ctl, "status", "--json"], env=env, timeout=30)
        if s.returncode != 0:
            return r.proc.poll() is not None
        seen.update({p["name"]: p for p in json.loads(s.stdout)["processes"]})
        return all(seen[n]["attempt"] == 1 and seen[n]["state"] == "RUNNING" for n in names)

    assert wait_until(restarted_and_running, timeout=180, step=0.2), (seen, r.proc.poll())
    assert {n: seen[n]["restarts"] for n in names} == {n: 1 for n in names}, seen
    assert {n: seen[n]["restarts_by"] for n in names} == want, seen
    table = run([*ctl, "status"], env=env, timeout=30).stdout
    for n, cell in (("drafter:0", "1 unit"), ("drafter:1", "1 own"), ("drafter:2", "1 unit")):
        assert re.search(rf"^{n} +RUNNING +\d+ +\S+ +\S+ +{cell} ", table, re.M), table
    metrics = run([*ctl, "metrics"], env=env, timeout=30).stdout
    if metrics:  # a build without prometheus-cpp serves none
        got = {(m[0], m[1]): float(m[2]) for m in
               re.findall(r'^dflash_restarts_total\{[^}]*process="([^"]+)"[^}]*reason="([^"]+)"[^}]*\} (\S+)$',
                          metrics, re.M)}
        for n in names:
            per = {reason: v for (p, reason), v in got.items() if p == n}
            assert sum(per.values()) == 1, (n, per)
            assert per["unit" if want[n]["unit"] else "exit"] == 1, (n, per)
    assert run([*ctl, "stop", "all"], env=env, timeout=30).returncode == 0
    assert r.wait(timeout=120) == 0, r.err[-3000:]
    by = {p["name"]: p for p in r.summary()["processes"]}
    assert {n: by[n]["restarts"] for n in names} == {n: 1 for n in names}, by
    assert {n: by[n]["restarts_by"] for n in names} == want, by
    for n, cell in (("drafter:0", "1 unit"), ("drafter:1", "1 own"), ("drafter:2", "1 unit")):
        assert re.search(rf"^{n} .* {cell} ", r.out, re.M), r.out

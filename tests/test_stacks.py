"""Stacks under real processes (issue 24 item 1 and 4, docs/stacks.md): a role `after` another starts only once
that one is ready, a stop runs in reverse (the payloads themselves see it), a dependency that fails leaves its
dependents never started, and a run of a service and jobs ends when the jobs are done."""
import json
import signal
import sys
import textwrap

from conftest import run
from supervise import write_config


def events(r):
    return [json.loads(line) for line in (r.run_dir / "events.jsonl").read_text().splitlines()]


def first(evs, process, to):
    for k, e in enumerate(evs):
        if e["process"] == process and e["to"] == to:
            return k
    raise AssertionError(f"no event of {process} -> {to}: {[(e['process'], e['to']) for e in evs]}")


def script(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def server_and_client(tmp_path, server_exit=None):
    """`server` is ready after 1 s (a log line, once its marker is written); `client` is after it. On SIGTERM
    each writes when it stopped; the server also writes whether the client had stopped by then."""
    server = script(tmp_path, "server", f"""
        import os, signal, sys, time
        out = {str(tmp_path)!r}
        def stop(*_):
            open(os.path.join(out, "server.stopped"), "w").write(
                "client had stopped" if os.path.exists(os.path.join(out, "client.stopped")) else "client still ran")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        time.sleep(1)
        if {server_exit!r} is not None:
            sys.exit({server_exit!r})
        open(os.path.join(out, "server.up"), "w").write("up")
        print("serving", flush=True)
        while True:
            time.sleep(1)
        """)
    client = script(tmp_path, "client", f"""
        import os, signal, sys, time
        out = {str(tmp_path)!r}
        rank = os.environ["ROLE_RANK"]
        open(os.path.join(out, "client.started." + rank), "w").write(
            "server was up" if os.path.exists(os.path.join(out, "server.up")) else "server was not up")
        def stop(*_):
            time.sleep(0.3)  # a client's clean shutdown still needs its server
            open(os.path.join(out, "client.stopped"), "a").write(rank)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("client up", flush=True)
        while True:
            time.sleep(1)
        """)
    return write_config(tmp_path, f"""
        [[role]]
        name = "server"
        cpu = 1
        command = ["{sys.executable}", "{server}"]
        ready = {{ mode = "log", pattern = "^serving$", timeout = "60s" }}
        stop = {{ grace = "10s" }}

        [[role]]
        name = "client"
        cpu = 2
        command = ["{sys.executable}", "{client}"]
        after = ["server"]
        ready = {{ mode = "log", pattern = "^client up$" }}
        stop = {{ grace = "10s" }}
        """)


def test_a_role_after_another_starts_once_it_is_ready_and_stops_before_it(launch, bin_dir, tmp_path):
    config = server_and_client(tmp_path)
    c = run([bin_dir / "dflash-launch", "check", config])
    assert c.returncode == 0, c.stderr
    assert "start order: server, then client" in c.stdout, c.stdout
    j = json.loads(run([bin_dir / "dflash-launch", "check", "--json", config]).stdout)
    assert j["start_order"] == "server, then client"
    assert [(x["name"], x["after"], x["phase"]) for x in j["roles"]] == [("server", [], 0), ("client", ["server"], 1)]

    r = launch(config)
    r.wait_for_log("client:1 STARTING -> RUNNING")
    r.wait_for_log("all 3 processes are running")
    for rank in "01":
        assert (tmp_path / f"client.started.{rank}").read_text() == "server was up"
    r.signal(signal.SIGTERM)
    assert r.wait(timeout=60) == 128 + signal.SIGTERM, r.err
    # The payloads saw the reverse order: both clients had ended when the server got its SIGTERM.
    assert (tmp_path / "server.stopped").read_text() == "client had stopped"
    assert sorted((tmp_path / "client.stopped").read_text()) == ["0", "1"]
    evs = events(r)
    assert first(evs, "server:0", "RUNNING") < first(evs, "client:0", "STARTING")
    assert first(evs, "server:0", "RUNNING") < first(evs, "client:1", "STARTING")
    assert first(evs, "client:0", "EXITED") < first(evs, "server:0", "STOPPING")
    assert first(evs, "client:1", "EXITED") < first(evs, "server:0", "STOPPING")
    assert [e["to"] for e in evs if e["process"] == "client:0"][:2] == ["WAITING", "STARTING"]


def test_a_dependency_that_fails_leaves_what_is_after_it_never_started(launch, bin_dir, tmp_path):
    config = server_and_client(tmp_path, server_exit=3)
    r = launch(config)
    assert r.wait(timeout=60) == 3, r.err
    s = r.summary()
    assert s["culprit"] == "server:0", s["reason"]
    client = {p["name"]: p for p in s["processes"]}["client:0"]
    assert client["state"] == "NOT_STARTED", client
    assert "before server is ready" in client["reason"], client
    assert not list(tmp_path.glob("client.started.*")), "a client was started into a dead stack"


def test_a_run_of_a_service_and_jobs_ends_when_the_jobs_are_done(launch, bin_dir, tmp_path):
    store = script(tmp_path, "store", f"""
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print("store ready", flush=True)
        while True:
            time.sleep(1)
        """)
    config = write_config(tmp_path, f"""
        [[role]]
        name = "store"
        cpu = 1
        command = ["{sys.executable}", "{store}"]
        service = true
        ready = {{ mode = "log", pattern = "^store ready$" }}

        [[role]]
        name = "job"
        cpu = 2
        command = ["{sys.executable}", "-c", "import time; time.sleep(0.5)"]
        """)
    c = run([bin_dir / "dflash-launch", "check", config])
    assert "start order: store, then job" in c.stdout, c.stdout
    assert "service  starts before the other roles" in c.stdout, c.stdout
    r = launch(config)
    assert r.wait(timeout=60) == 0, r.err
    s = r.summary()
    assert "services were stopped" in s["reason"], s["reason"]
    procs = {p["name"]: p for p in s["processes"]}
    assert procs["store:0"]["attempts"][-1]["outcome"] == "stopped", procs["store:0"]
    assert all(procs[f"job:{k}"]["attempts"][-1]["outcome"] == "succeeded" for k in "01")
    evs = events(r)
    assert first(evs, "store:0", "RUNNING") < first(evs, "job:0", "STARTING")
    assert first(evs, "job:1", "EXITED") < first(evs, "store:0", "STOPPING")


def test_a_cycle_is_a_config_error_and_nothing_is_spawned(launch, bin_dir, tmp_path):
    marker = tmp_path / "spawned"
    cmd = f'["{sys.executable}", "-c", "open({str(marker)!r}, \'w\')"]'
    config = write_config(tmp_path, f"""
        [[role]]
        name = "a"
        cpu = 1
        command = {cmd}
        after = ["b"]

        [[role]]
        name = "b"
        cpu = 1
        command = {cmd}
        after = ["a"]
        """)
    r = launch(config)
    assert r.wait(timeout=30) == 2, r.err
    assert "run.toml:" in r.err and "the roles' start order has a cycle: a -> b -> a" in r.err, r.err
    assert not marker.exists()

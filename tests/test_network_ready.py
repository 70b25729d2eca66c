"""Readiness over the network (issue 24 item 2): ready = tcp/http probes a server the supervisor runs, and
liveness = {...} probes it while it runs. The servers are Python programs written by each test; what they
did (bound, answered 503, answered 200) they write to a file with the wall time, and the tests compare that
with events.jsonl and summary.json: orderings, never durations."""
import json
import os
import signal
import socket
import sys
import textwrap

from supervise import wait_until, write_config

# A small HTTP/TCP server. argv: port, plan file. The plan (JSON) says what to do:
#   delay: seconds before it binds; answers: statuses for the first requests (then "last" for the
#   others: a status, "silent" (accept, never answer) or "exit:N" (exit N at the next request));
#   on attempt >= 1 (a restart), answers_restarted replaces answers.
# Each thing it does is one line of <plan>.log: "<what> <time.time()> <attempt>".
SERVER = textwrap.dedent("""\
    import json, os, socket, sys, time
    port, plan_path = int(sys.argv[1]), sys.argv[2]
    plan = json.load(open(plan_path))
    attempt = int(os.environ.get("DFLASH_ATTEMPT", "0"))
    if attempt >= 1 and "answers_restarted" in plan:
        plan["answers"], plan["last"] = plan["answers_restarted"], plan.get("last_restarted", plan["last"])
    def note(what):
        with open(plan_path + ".log", "a") as f:
            f.write(f"{what} {time.time()} {attempt}\\n")
    time.sleep(plan.get("delay", 0))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    note("bound")
    answers, held = list(plan.get("answers", [])), []
    exit_after = plan.get("exit_after_answers_restarted" if attempt >= 1 else "exit_after_answers", False)
    while True:
        c, _ = s.accept()
        what = answers.pop(0) if answers else plan["last"]
        if what == "silent":
            held.append(c)  # accepted, never answered, never closed
            note("silent")
            continue
        if isinstance(what, str) and what.startswith("exit:"):
            note("exit")
            os._exit(int(what[5:]))
        c.settimeout(5)
        try:
            c.recv(4096)
            note(f"answered {what}")  # before it is sent: the supervisor cannot have judged it earlier
            c.sendall(f"HTTP/1.0 {what} X\\r\\nContent-Length: 0\\r\\n\\r\\n".encode())
        except OSError:
            pass
        c.close()
        if exit_after and not answers:
            note("done")
            sys.exit(0)
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_role(tmp_path, plan, ready, extra=""):
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    url = f"http://127.0.0.1:{port}/health"
    body = f"""
[[role]]
name = "s"
cpu = 1
command = ["{sys.executable}", "{tmp_path / 'server.py'}", "{port}", "{tmp_path / 'plan.json'}"]
ready = {ready.format(port=port, url=url)}
{extra.format(port=port, url=url)}
"""
    return write_config(tmp_path, body), port


def server_log(tmp_path):
    """[(what, time, attempt)] the server did, in order."""
    path = tmp_path / "plan.json.log"
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        what, t, attempt = line.rsplit(" ", 2)
        out.append((what, float(t), int(attempt)))
    return out


def events(run):
    return [json.loads(line) for line in (run.run_dir / "events.jsonl").read_text().splitlines()]


def running_events(run, name="s:0"):
    return [e for e in events(run) if e.get("process") == name and e.get("to") == "RUNNING"]


def stop(run):
    run.signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM, run.err


def test_a_server_slow_to_bind_is_ready_after_it_binds(launch, tmp_path):
    config, _ = server_role(tmp_path, {"delay": 2, "last": 200},
                            '{{ mode = "http", url = "{url}", interval = "100ms", timeout = "60s" }}')
    r = launch(config)
    r.wait_for_log("RUNNING")
    bound = [t for what, t, _ in server_log(tmp_path) if what == "bound"]
    assert len(bound) == 1, server_log(tmp_path)
    ready = running_events(r)
    assert len(ready) == 1, events(r)
    assert ready[0]["time"] >= bound[0], (ready[0], bound)
    assert "HTTP 200" in ready[0]["reason"], ready[0]
    stop(r)
    s = r.summary()
    assert s["processes"][0]["attempts"][0]["ready_s"] > 0, s


def test_a_server_answering_503_is_ready_only_after_its_200(launch, tmp_path):
    config, _ = server_role(tmp_path, {"answers": [503, 503, 503], "last": 200},
                            '{{ mode = "http", url = "{url}", interval = "100ms", timeout = "60s" }}')
    r = launch(config)
    r.wait_for_log("RUNNING")
    # The server logs an answer after sending it: the supervisor may have judged it first.
    answered = lambda: [(what, t) for what, t, _ in server_log(tmp_path) if what.startswith("answered")]  # noqa: E731
    assert wait_until(lambda: len(answered()) >= 4), server_log(tmp_path)
    log = server_log(tmp_path)
    answers = answered()
    assert [w for w, _ in answers[:4]] == ["answered 503"] * 3 + ["answered 200"], log
    first_200 = answers[3][1]
    ready = running_events(r)
    assert len(ready) == 1 and ready[0]["time"] >= first_200, (ready, answers)
    assert "HTTP 200" in ready[0]["reason"], ready[0]
    stop(r)


def test_a_status_outside_the_set_is_never_ready_and_the_timeout_says_what_it_saw(launch, tmp_path):
    config, _ = server_role(tmp_path, {"last": 204},
                            '{{ mode = "http", url = "{url}", status = "200", interval = "100ms", timeout = "3s" }}')
    r = launch(config)
    assert r.wait(timeout=120) == 75, r.err
    s = r.summary()
    assert s["culprit"] == "s:0", s
    assert "never answered with 200; last try: HTTP 204 (wanted 200)" in s["reason"], s["reason"]
    assert not running_events(r), events(r)


def test_a_server_that_dies_before_answering_fails_as_a_process_not_ready(launch, tmp_path):
    config, port = server_role(tmp_path, {"last": "exit:3"},
                               '{{ mode = "http", url = "{url}", interval = "100ms", timeout = "60s" }}')
    r = launch(config)
    assert r.wait(timeout=120) == 3, r.err
    assert [w for w, _, _ in server_log(tmp_path)] == ["bound", "exit"], server_log(tmp_path)
    s = r.summary()
    assert s["culprit"] == "s:0", s
    reason = s["processes"][0]["attempts"][0]["reason"]
    assert reason.startswith("exited with code 3 before it was ready (ready = http: GET "
                             f"http://127.0.0.1:{port}/health never answered with 2xx; last try: "), reason
    assert s["processes"][0]["attempts"][0]["ready_s"] is None, s  # never ready
    assert not running_events(r), events(r)


def test_a_tcp_probe_is_ready_once_the_port_accepts(launch, tmp_path):
    config, port = server_role(tmp_path, {"delay": 1, "last": 200},
                               '{{ mode = "tcp", port = {port}, interval = "100ms", timeout = "60s" }}')
    r = launch(config)
    r.wait_for_log("RUNNING")
    bound = [t for what, t, _ in server_log(tmp_path) if what == "bound"]
    ready = running_events(r)
    assert len(bound) == 1 and len(ready) == 1 and ready[0]["time"] >= bound[0], (bound, ready)
    assert f"tcp 127.0.0.1:{port}: connected" in ready[0]["reason"], ready[0]
    stop(r)


def test_a_server_that_stops_answering_is_hung_and_restarted_by_policy(launch, tmp_path):
    # Attempt 0 answers three probes (ready, two liveness), then accepts and never answers: two failed
    # liveness tries in a row make it hung. Attempt 1 answers, serves a few more, then exits 0.
    config, port = server_role(
        tmp_path,
        {"answers": [200, 200, 200], "last": "silent", "answers_restarted": [200, 200, 200],
         "exit_after_answers_restarted": True},
        '{{ mode = "http", url = "{url}", interval = "100ms", timeout = "60s" }}',
        'liveness = {{ mode = "http", url = "{url}", interval = "200ms", probe_timeout = "2s", failures = 2 }}\n'
        'restart = {{ policy = "on-failure", max = 2, window = "1h", backoff = "100ms..100ms" }}\n'
        'stop = {{ grace = "5s" }}')
    r = launch(config)
    assert r.wait(timeout=120) == 0, r.err
    s = r.summary()
    attempts = s["processes"][0]["attempts"]
    assert len(attempts) == 2, attempts
    hung, second = attempts
    assert hung["hung"] is True and hung["outcome"] == "restarted", hung
    assert hung["reason"].startswith(
        f"hung: liveness: 2 failed tries in a row of GET http://127.0.0.1:{port}/health (2xx) "
        "(last: no answer within 2s)"), hung["reason"]
    assert hung["signal"] == "SIGABRT", hung
    assert second["exit_code"] == 0 and not second["hung"], second
    # The hung verdict came after the server went silent, not before.
    silent = [t for what, t, a in server_log(tmp_path) if what == "silent" and a == 0]
    stopping = [e for e in events(r) if e.get("to") == "STOPPING" and "liveness" in e.get("reason", "")]
    assert silent and len(stopping) == 1 and stopping[0]["time"] >= silent[0], (silent, stopping)

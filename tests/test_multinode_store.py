"""Node launchers coordinated through Redis (docs/multinode.md, "The store"): two `dflash-launch run --nnodes 2`
on this host (loopback), each test with its own redis-server (the `redis_server` fixture). A gloo all_reduce over
8 ranks across 2 roles with the store; a SIGKILLed launcher noticed by the other node; scope = "all" rounds across
nodes; a failure on one node stopping the other with the culprit; stale and duplicate registrations; a Redis
restarted mid-run; an unreachable store; the private store."""
import json
import os
import pathlib
import signal
import socket
import subprocess
import time

from conftest import run
from supervise import EVENT_TIMEOUT, holds_for, wait_until, write_config
from test_nodes import PY, GLOO, finish, gloo_roles, results, start


# ---- a few raw RESP commands (the venv has no redis client; the launcher uses hiredis) ----

def _read_reply(f):
    line = f.readline().rstrip(b"\r\n")
    kind, rest = line[:1], line[1:]
    if kind in (b"+", b"-"):
        return rest.decode()
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)[:-2]
        return data.decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise AssertionError(f"bad reply {line!r}")


def redis_cmd(port, *args):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        payload = b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in map(str, args))
        s.sendall(payload)
        return _read_reply(s.makefile("rb"))


def node_keys(port, run_id):
    return sorted(redis_cmd(port, "KEYS", f"dflash:{run_id}:node:*") or [])


# ---- configs and processes ----

def store_config(tmp_path, store, roles, extra_run=""):
    return write_config(tmp_path, f'store = "{store}"\nstore_ttl = "1s"\n{extra_run}\n' + roles)


WAITER = """
    [[role]]
    name = "w"
    cpu = 2
    command = ["sh", "-c", "touch {out}/$RANK.started; while [ ! -e {out}/go ]; do sleep 0.05; done; {tail}"]
    stop = {{ signal = "SIGTERM", grace = "5s" }}
    {extra}
    """


def waiters(out, tail="exit 0", extra=""):
    return WAITER.format(out=out, tail=tail, extra=extra)


def started(out, n=4):
    return len(list(out.glob("*.started"))) >= n


def launch_node(bin_dir, config, run_id, rank, *args):
    return start(bin_dir, config, run_id, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                 *args)


def survivors(run_id):
    """Processes of this run still alive (their env says DFLASH_RUN_ID=run_id), zombies aside."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"DFLASH_RUN_ID={run_id}".encode() in env and state != "Z":
            found.append(int(d.name))
    return found


def summary(tmp_path, run_id, node):
    return json.loads((tmp_path / f"runs/{run_id}/node_{node}/summary.json").read_text())


# ---- (a) the all_reduce with the store ----

def test_two_nodes_with_the_store_all_reduce_over_8_ranks(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, gloo_roles(out))
    nodes = [launch_node(bin_dir, config, "st", r) for r in (0, 1)]
    for p in nodes:
        rc, _, err = finish(p)
        assert rc == 0, err
    res = results(out, "st")
    assert sorted(res) == list(range(8))
    assert all(r["sum"] == 36.0 and r["world"] == 8 for r in res.values())
    # A clean end is "done", then unregistered: nothing is left claiming the nodes.
    assert node_keys(redis_server.port, "st") == []
    done = sorted(redis_cmd(redis_server.port, "KEYS", "dflash:st:*:done:*"))
    assert len(done) == 2 and all(redis_cmd(redis_server.port, "GET", k) == "0" for k in done)


# ---- (b) a launcher SIGKILLed ----

def test_sigkill_of_node_1s_launcher_stops_node_0_naming_it(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, waiters(out))
    nodes = [launch_node(bin_dir, config, "kl", r) for r in (0, 1)]
    try:
        assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT), "the processes did not start"
        t0 = time.monotonic()
        os.kill(nodes[1].pid, signal.SIGKILL)
        rc0, out0, err0 = finish(nodes[0], timeout=60)
        err0 += out0  # the console (stdout) says it once the run is under way
        elapsed = time.monotonic() - t0
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert rc0 == 70, err0
    s = summary(tmp_path, "kl", 0)
    assert s["culprit"] == "node 1 (launcher lost)" and s["node_culprit"]["node"] == 1
    assert "node 1's launcher lost" in s["reason"] and "launcher lost" in err0
    # Documented: noticed within store_ttl + a poll (1 s + 0.1 s here), then SIGTERM stops the waiters at once;
    # how long is load (bench/multinode measures it): the event is the culprit above, within finish()'s bound.
    print(f"node 0 noticed and stopped in {elapsed:.1f}s")
    assert all(p["state"] == "EXITED" and p["collateral"] for p in s["processes"])
    # Node 1's processes died with their launcher (PDEATHSIG, the guardian); node 0's were stopped.
    assert wait_until(lambda: not survivors("kl"), timeout=EVENT_TIMEOUT), survivors("kl")


# ---- (c) scope = "all": a round of every node ----

def test_scope_all_failure_on_node_1_restarts_both_nodes_processes(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    restart = 'restart = { policy = "on-failure", scope = "all", max = 1, window = "1h", backoff = "1s..1s" }'
    # One process per role and node (4 ranks: the restart is the point, not the count). Rank 2 (node 1, a:1) fails
    # before joining the world on its first attempt; the others wait for it in init_process_group until the round
    # stops them.
    cmd = json.dumps(["sh", "-c", f'[ "$RANK" = 2 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 3; '
                                  f'exec {PY} {GLOO} {out}'])
    roles = f"""
        [[role]]
        name = "a"
        cpu = 1
        command = {cmd}
        {restart}

        [[role]]
        name = "b"
        cpu = 1
        command = {cmd}
        {restart}
        """
    config = store_config(tmp_path, redis_server.url, roles)
    nodes = [launch_node(bin_dir, config, "rd", r) for r in (0, 1)]
    for p in nodes:
        rc, _, err = finish(p, timeout=240)
        assert rc == 0, err
    res = results(out, "rd")
    assert sorted(res) == list(range(4)) and all(r["sum"] == 10.0 for r in res.values())
    for node in (0, 1):
        s = summary(tmp_path, "rd", node)
        for p in s["processes"]:
            assert len(p["attempts"]) == 2, (node, p["name"], p["attempts"])
            assert p["attempts"][0]["outcome"] == "restarted" and p["attempts"][1]["outcome"] == "succeeded"
    a1 = next(p for p in summary(tmp_path, "rd", 1)["processes"] if p["name"] == "a:1")
    assert a1["attempts"][0]["exit_code"] == 3


# ---- (d) a failure with no restart stops the other node ----

def test_non_restartable_failure_on_node_1_stops_node_0_with_the_culprit(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    # Rank 3 fails as soon as it starts; node 0's processes only wait: they end because node 0 stops them.
    cmd = json.dumps(["sh", "-c", f'touch {out}/$RANK.started; [ "$RANK" = 3 ] && exit 7; exec sleep 1000'])
    roles = f"""
        [[role]]
        name = "w"
        cpu = 2
        command = {cmd}
        """
    config = store_config(tmp_path, redis_server.url, roles)
    nodes = [launch_node(bin_dir, config, "nf2", r) for r in (0, 1)]
    (rc0, out0, err0), (rc1, _, err1) = finish(nodes[0], timeout=60), finish(nodes[1], timeout=60)
    err0 += out0
    assert rc1 == 7, err1
    assert rc0 == 70, err0
    s0 = summary(tmp_path, "nf2", 0)
    assert s0["culprit"] == "node 1: w:3", s0
    assert s0["node_culprit"] == {"node": 1, "process": "w:3", "exit_code": 7,
                                  "reason": s0["node_culprit"]["reason"]}
    assert "exited with code 7" in s0["node_culprit"]["reason"]
    assert "node 1 failed: w:3" in err0
    assert all(p["collateral"] for p in s0["processes"])
    assert summary(tmp_path, "nf2", 1)["culprit"] == "w:3"
    failed = redis_cmd(redis_server.port, "KEYS", "dflash:nf2:*:failed")
    rec = json.loads(redis_cmd(redis_server.port, "GET", failed[0]))
    assert rec["node"] == 1 and rec["process"] == "w:3" and rec["exit_code"] == 7
    assert wait_until(lambda: not survivors("nf2"), timeout=EVENT_TIMEOUT)


# ---- (e) a stale registration of an earlier run ----

def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_stale_registration_of_a_dead_launcher_on_this_host_is_taken_over(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    key = "dflash:sl:node:1"
    pid_scope = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip() + "/" + os.readlink("/proc/self/ns/pid")
    redis_cmd(redis_server.port, "HSET", key, "host", socket.gethostname(), "pid_scope", pid_scope, "pid", dead_pid(),
              "pid_start", "1", "started", "earlier", "nonce", "old", "hb", "3")
    redis_cmd(redis_server.port, "PEXPIRE", key, 600000)  # it would outlive the test: only a take-over explains success
    config = store_config(tmp_path, redis_server.url, waiters(out))
    nodes = [launch_node(bin_dir, config, "sl", r) for r in (0, 1)]
    assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT)
    (out / "go").touch()
    (rc0, _, err0), (rc1, _, err1) = finish(nodes[0]), finish(nodes[1])
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    assert "took over the stale registration of node 1" in err1


def test_a_stale_registration_from_elsewhere_blocks_the_barrier_until_it_expires(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    key = "dflash:sx:node:1"
    redis_cmd(redis_server.port, "HSET", key, "host", "another-host", "pid", "4242", "pid_start", "1",
              "started", "earlier", "nonce", "old", "hb", "3")
    redis_cmd(redis_server.port, "PEXPIRE", key, 4000)
    config = store_config(tmp_path, redis_server.url, waiters(out))
    node0 = launch_node(bin_dir, config, "sx", 0)
    try:
        # The stale record is there but never refreshed: node 0 must not take it for node 1 (1.5 s is
        # 4 polls of the heartbeat counter at ttl 1 s and 15 of the watch: ample to see it does not advance).
        assert holds_for(lambda: not list(out.glob("*.started")) and node0.poll() is None, 1.5)
        node1 = launch_node(bin_dir, config, "sx", 1)
        assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT)
        (out / "go").touch()
        (rc0, _, err0), (rc1, _, err1) = finish(node0), finish(node1)
    finally:
        if node0.poll() is None:
            os.killpg(node0.pid, signal.SIGKILL)
    assert rc0 == 0 and rc1 == 0, (err0, err1)
    assert "waiting for the registration of node 1" in err1 and "another-host" in err1


# ---- (f) a second launcher for the same node ----

def test_a_second_launcher_for_the_same_node_exits_69_naming_the_first(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, waiters(out))
    other = tmp_path / "other"  # another log dir: the run.lock does not see it, the store does
    other.mkdir()
    config2 = store_config(other, redis_server.url, waiters(out))
    nodes = [launch_node(bin_dir, config, "dup", r) for r in (0, 1)]
    assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT)
    r = run([str(bin_dir / "dflash-launch"), "run", str(config2), "--run-id", "dup", "--nnodes", "2",
             "--node-rank", "1", "--color", "never"], timeout=60)
    assert r.returncode == 69, r.stderr
    assert f"node 1 of run dup is held by dflash-launch pid {nodes[1].pid}" in r.stderr
    assert not (other / "runs/dup/node_1/attempt_0").exists()  # nothing spawned
    (out / "go").touch()
    for p in nodes:  # the first pair is untouched
        rc, _, err = finish(p)
        assert rc == 0, err


# ---- (g) Redis restarted (empty) mid-run; and gone for good ----

def test_a_redis_restarted_mid_run_loses_nothing(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, waiters(out))
    nodes = [launch_node(bin_dir, config, "rr", r) for r in (0, 1)]
    assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT)
    redis_server.restart()  # empty: both registrations are gone
    assert wait_until(lambda: node_keys(redis_server.port, "rr") == ["dflash:rr:node:0", "dflash:rr:node:1"],
                      timeout=EVENT_TIMEOUT), "the nodes did not register again"
    # Neither took the other's missing key for a death: both run on (2 s is 2 ttls past the grace).
    assert holds_for(lambda: all(p.poll() is None for p in nodes), 2.0)
    (out / "go").touch()
    for p in nodes:
        rc, out_text, err = finish(p)
        assert rc == 0, err
        assert "registered again" in out_text or "is back after" in out_text


def test_a_store_gone_for_longer_than_store_outage_stops_the_node(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, waiters(out), extra_run='store_outage = "2s"')
    nodes = [launch_node(bin_dir, config, "so", r) for r in (0, 1)]
    assert wait_until(lambda: started(out), timeout=EVENT_TIMEOUT)
    redis_server.kill()
    for p in nodes:
        rc, out_text, err = finish(p, timeout=60)
        assert rc == 70, err
        assert "was unreachable for longer than 2s" in out_text
    assert summary(tmp_path, "so", 0)["culprit"] == "the store"
    assert wait_until(lambda: not survivors("so"), timeout=EVENT_TIMEOUT)


# ---- (h) no store at the start ----

def test_an_unreachable_store_at_the_start_is_a_clear_error_and_nothing_is_spawned(bin_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, f"redis://127.0.0.1:{port}", waiters(out), extra_run='store_outage = "1s"')
    r = run([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", "un", "--nnodes", "2",
             "--node-rank", "0", "--color", "never"], timeout=60)
    assert r.returncode == 69, r.stderr
    assert f"cannot reach the store redis://127.0.0.1:{port}" in r.stderr and "nothing was started" in r.stderr
    assert not list(out.glob("*.started")) and not (tmp_path / "runs/un/node_0/attempt_0").exists()


def test_ctrl_c_during_a_registration_the_store_never_answers_ends_it_at_once(bin_dir, tmp_path):
    # A listener that accepts and never replies: every claim times out, and Register would retry for
    # 3 x store_ttl + store_outage (here 10 min). SIGINT (blocked, read from a signalfd) must end it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        out = tmp_path / "out"
        out.mkdir()
        config = store_config(tmp_path, f"redis://127.0.0.1:{port}", waiters(out), extra_run='store_outage = "10m"')
        p = launch_node(bin_dir, config, "ci", 0)
        try:
            silent.settimeout(EVENT_TIMEOUT)
            conn, _ = silent.accept()  # the launcher has reached the store: it is registering now
            with conn:
                assert p.poll() is None
                p.send_signal(signal.SIGINT)
                rc, _, err = finish(p, timeout=EVENT_TIMEOUT)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert rc == 128 + signal.SIGINT, err
    assert f"stopped by SIGINT while registering node 0 of run ci in redis://127.0.0.1:{port}" in err
    assert "nothing was started" in err
    assert not list(out.glob("*.started")) and not (tmp_path / "runs/ci/node_0/attempt_0").exists()


# ---- the private store, the flag, the config ----

def test_the_private_store_serves_both_nodes_and_ends_with_node_0(bin_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    roles = f"""
        [[role]]
        name = "w"
        cpu = 1
        command = ["sh", "-c", "echo $DFLASH_STORE > {out}/$RANK.store"]
        """
    secret = tmp_path / "store.secret"  # several nodes: every launcher must know the run's password
    secret.write_text("pv-secret\n")
    secret.chmod(0o600)
    config = write_config(tmp_path, f'store = "private"\nstore_ttl = "1s"\nstore_password_file = "{secret}"\n' + roles)
    nodes = [launch_node(bin_dir, config, "pv", r) for r in (0, 1)]
    for p in nodes:
        rc, _, err = finish(p)
        assert rc == 0, err
    urls = {(out / f"{r}.store").read_text().strip() for r in (0, 1)}
    assert len(urls) == 1
    url = urls.pop()
    assert url.startswith("redis://127.0.0.1:")
    port = int(url.rsplit(":", 1)[1])
    plan = json.loads(run([str(bin_dir / "dflash-launch"), "check", str(config), "--json", "--run-id", "pv",
                           "--nnodes", "2", "--node-rank", "1"]).stdout)
    assert plan["run"]["store"]["url"] == url and plan["run"]["store"]["private"] is True
    # node 0's redis-server ended with it
    from redis_server import listening
    assert not listening(port)


def test_the_store_flag_beats_the_config_and_check_json_shows_it(bin_dir, tmp_path):
    config = store_config(tmp_path, "redis://10.0.0.5:6379/2", waiters(tmp_path))
    plan = json.loads(run([str(bin_dir / "dflash-launch"), "check", str(config), "--json"]).stdout)
    assert plan["run"]["store"] == {"url": "redis://10.0.0.5:6379/2", "private": False, "ttl_ms": 1000,
                                    "barrier_timeout_ms": 300000, "outage_ms": 30000}
    plan = json.loads(run([str(bin_dir / "dflash-launch"), "check", str(config), "--json", "--store",
                           "redis://h:7000"]).stdout)
    assert plan["run"]["store"]["url"] == "redis://h:7000"
    text = run([str(bin_dir / "dflash-launch"), "check", str(config), "--store", "redis://h:7000"]).stdout
    assert "DFLASH_STORE=redis://h:7000" in text
    r = run([str(bin_dir / "dflash-launch"), "check", str(config), "--store", "http://h"])
    assert r.returncode == 64 and "--store" in r.stderr and "only redis://" in r.stderr
    (tmp_path / "n").mkdir()
    no_store = write_config(tmp_path / "n", waiters(tmp_path))
    plan = json.loads(run([str(bin_dir / "dflash-launch"), "check", str(no_store), "--json"]).stdout)
    assert plan["run"]["store"] is None


def test_a_bad_store_is_a_config_error_with_its_place(bin_dir, tmp_path):
    config = write_config(tmp_path, 'store = "redis://user:pw@host"\nstore_ttl = "100ms"\n' + waiters(tmp_path))
    r = run([str(bin_dir / "dflash-launch"), "check", str(config)])
    assert r.returncode == 2
    assert "run.toml:5:9" in r.stderr and "run.store" in r.stderr and "store_password_file" in r.stderr
    assert "user:pw" not in r.stderr  # a password in the URL is never echoed
    assert "run.store_ttl" in r.stderr and "at least 300ms" in r.stderr


def test_the_start_barrier_runs_out_naming_the_missing_node_and_nothing_starts(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = store_config(tmp_path, redis_server.url, waiters(out), extra_run='store_barrier_timeout = "1s"')
    r = run([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", "bt", "--nnodes", "2",
             "--node-rank", "0", "--color", "never"], timeout=60)
    assert r.returncode == 75, r.stderr
    assert "the start barrier: node(s) 1 of 2 did not register" in r.stderr and "nothing was started" in r.stderr
    assert not list(out.glob("*.started"))
    assert node_keys(redis_server.port, "bt") == []  # it unregistered on its way out

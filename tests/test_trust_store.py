"""Who can use the run's store (docs/multinode.md, "Who can use the store"; issue #21 items 3, 5, 7): real
redis-servers and real `dflash-launch run`s on this host. Another local user (nobody, via setpriv) cannot read,
write or stop the private store; a redis:// store with a password from a file works and the password is in no
process's argv, no `check` output, no log; without it the error says so and names the key to set; a forged
failure record naming node 9 stops nobody; a node whose registration is deleted stops its processes with exit
76 instead of registering again into a run that has moved on."""
import hashlib
import json
import hmac
import os
import pathlib
import re
import shutil
import signal
import sys
import time

import pytest

from conftest import run
from impostor import Impostor
from redis_server import RedisServer, listening, ping, resp
from supervise import EVENT_TIMEOUT, holds_for, wait_until, write_config
from test_multinode_store import launch_node, started, summary, survivors, waiters
from test_nodes import finish, start


def all_cmdlines():
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((d / "cmdline").read_bytes())
            except OSError:
                pass
    return out


def private_store_password(secret, run_id):
    """store/store_auth.h PrivateStoreAuthPassword: what a private store's clients send with AUTH."""
    return hmac.new(secret.encode(), b"dflash private store AUTH/1\n" + run_id.encode(), hashlib.sha256).hexdigest()


def secret_file(tmp_path, secret):
    path = tmp_path / "store.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (secret + "\n").encode())
    os.close(fd)
    return path


def as_nobody(*argv):
    """Runs argv as uid/gid 65534: another local user of this host."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    return run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], timeout=30)


def finish_all(nodes, timeout=120):
    got = [finish(p, timeout=timeout) for p in nodes]
    return got


def kill_all(nodes):
    for p in nodes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# ---- the private store against the host's other users ----

def test_another_user_cannot_read_write_or_shut_down_the_private_store(bin_dir, tmp_path):
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed")
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, 'store = "private"\n' + waiters(out))
    p = start(bin_dir, config, "ts-pv")
    try:
        assert wait_until(lambda: started(out, 2), timeout=EVENT_TIMEOUT), "the processes did not start"
        run_dir = tmp_path / "runs/ts-pv"
        secret = (run_dir / "store.secret").read_text().strip()
        assert len(secret) == 64 and oct((run_dir / "store.secret").stat().st_mode & 0o777) == "0o600"
        # The password is in nobody's argv (/proc/*/cmdline is world-readable), redis-server's included.
        assert not [c for c in all_cmdlines() if secret.encode() in c]
        port = int(re.search(r"private store: redis-server pid \d+ on redis://[^:]+:(\d+)",
                             (run_dir / "supervisor.log").read_text()).group(1))
        for argv in (["KEYS", "*"], ["SET", "dflash:x", "1"], ["SHUTDOWN", "NOSAVE"],
                     ["CONFIG", "SET", "dir", str(run_dir)]):
            r = as_nobody("redis-cli", "-h", "127.0.0.1", "-p", str(port), *argv)
            said = r.stdout + r.stderr
            assert "NOAUTH" in said or "unknown command" in said, (argv, said)
        # The store's password is derived from the secret and the run id: the secret itself (which signs
        # shipped kernels) is never what a client sends, so it is not a password here.
        password = private_store_password(secret, "ts-pv")
        assert "WRONGPASS" in resp(port, "PING", password=secret)
        # Even with the password: no SHUTDOWN, no CONFIG (so no dump.rdb written anywhere), no DEBUG.
        for argv in (["SHUTDOWN", "NOSAVE"], ["CONFIG", "SET", "save", "1 1"], ["DEBUG", "SLEEP", "0"]):
            assert "unknown command" in resp(port, *argv, password=password), argv
        assert resp(port, "PING", password=password) == "PONG"
        (out / "go").touch()
        rc, o, e = finish(p)
    finally:
        kill_all([p])
    assert rc == 0, o + e
    assert not (run_dir / "dump.rdb").exists()
    assert not (run_dir / "store.secret").exists()  # gone with the run
    assert not listening(port)
    assert secret not in o + e + (run_dir / "supervisor.log").read_text()


def slow_redis_server(tmp_path, delay=3):
    """A redis-server first on PATH that starts `delay` seconds late: the window between the launcher's probe of
    the store's port and redis-server's bind, which an attacker watching the port lock files gets anyway."""
    real = shutil.which("redis-server")
    if real is None:
        pytest.skip("redis-server is not installed")
    d = tmp_path / "slow-bin"
    d.mkdir()
    (d / "redis-server").write_text(f'#!/bin/sh\nsleep {delay}\nexec {real} "$@"\n')
    (d / "redis-server").chmod(0o755)
    return dict(os.environ, PATH=f"{d}:{os.environ['PATH']}")


def test_a_port_taken_before_redis_binds_gets_no_password_and_nothing_starts(bin_dir, tmp_path):
    """Issue #38 item 1: another user binds the private store's port after its lock file appears and before
    redis-server binds it. Before: the launcher sent `AUTH <run password>` (the key that signs shipped kernels) to
    the impostor and ran the whole run on it. Now: the listener is not the launcher's child's socket, so not one
    byte is sent; exit 69 names the squatter; nothing starts."""
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, 'store = "private"\n' + waiters(out))
    impostor = Impostor("redis", match="run ts-sq, its private store")
    try:
        p = start(bin_dir, config, "ts-sq", env=slow_redis_server(tmp_path))
        rc, o, e = finish(p, timeout=90)
    finally:
        impostor.stop()
    assert impostor.port, "the impostor never saw the store's port lock"
    assert impostor.received == "", f"sent to another user's server: {impostor.received[:300]!r}"
    assert rc == 69, o + e
    assert f"uid 65534 (nobody), pid" in e and "nothing was sent to it" in e, e
    assert not list(out.glob("*.started"))


def test_a_private_store_that_dies_mid_run_is_not_replaced_by_whoever_binds_its_port(bin_dir, tmp_path):
    """Item 1, later in the run: the store's redis-server dies (OOM killer, a crash) and another user binds its
    port at once. Before: the coordinator reconnected and sent the password to the new listener, and the run went
    on. Now: the run stops (exit 70, the private store named) and no reconnection sends anything to a listener
    that is not the run's own redis-server."""
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, 'store = "private"\nstore_ttl = "1s"\n' + waiters(out))
    p = start(bin_dir, config, "ts-md")
    impostor = None
    try:
        assert wait_until(lambda: started(out, 2), timeout=EVENT_TIMEOUT), "the processes did not start"
        log = (tmp_path / "runs/ts-md/supervisor.log").read_text()
        m = re.search(r"private store: redis-server pid (\d+) on redis://[^:]+:(\d+)", log)
        pid, port = int(m.group(1)), int(m.group(2))
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not listening(port), timeout=EVENT_TIMEOUT)
        impostor = Impostor("redis", port=port)
        assert wait_until(lambda: impostor.port == port or impostor.proc.poll() is not None, timeout=EVENT_TIMEOUT)
        wait_until(lambda: p.poll() is not None or impostor.received, timeout=30)
        (out / "go").touch()
        rc, o, e = finish(p, timeout=90)
    finally:
        kill_all([p])
        if impostor:
            impostor.stop()
    assert impostor.port == port
    assert "AUTH" not in impostor.received and impostor.received == "", impostor.received[:300]
    assert rc == 70, o + e
    assert "the private store (redis-server pid" in o + e and "the run's store is gone" in o + e, o + e


def resp_commands(data):
    """The commands (lists of str) in a client's RESP bytes, as a Redis server reads them."""
    out, i = [], 0
    while i < len(data) and data[i] == "*":
        j = data.index("\r\n", i)
        n, i, args = int(data[i + 1:j]), j + 2, []
        for _ in range(n):
            j = data.index("\r\n", i)
            size = int(data[i + 1:j])
            args.append(data[j + 2:j + 2 + size])
            i = j + 2 + size + 2
        out.append(args)
    return out


def test_a_node_that_cannot_prove_the_store_sends_a_squatter_no_secret(bin_dir, tmp_path):
    """Item 1, the other nodes: node 1 reaches node 0's private store over the network and cannot prove whose
    listener it is. Before #38: it sent `AUTH <the run's secret>`; before #46: `AUTH <HMAC(secret, run id)>`, which
    opens the run's live store. Now: it first asks the store to answer a fresh challenge with a key derived from
    the secret; a squatter that cannot gets only the public proof login and the challenge, no AUTH at all."""
    out = tmp_path / "out"
    out.mkdir()
    secret = "s3cret-of-the-run-" + "x" * 20
    # store_outage 3s: node 1 tries the squatter again until then (the real store may yet come), 30 s by default.
    config = write_config(tmp_path, f'store = "private"\nstore_barrier_timeout = "3s"\nstore_outage = "3s"\n'
                                    f'store_password_file = "{secret_file(tmp_path, secret)}"\n' + waiters(out))
    plan = run([bin_dir / "dflash-launch", "check", config, "--json", "--run-id", "ts-rn", "--nnodes", "2",
                "--node-rank", "1", "--master-addr", "127.0.0.1"])
    assert plan.returncode == 0, plan.stderr
    port = int(json.loads(plan.stdout)["run"]["store"]["url"].rsplit(":", 1)[1].split("/")[0])
    impostor = Impostor("refuse", port=port)
    try:
        assert wait_until(lambda: impostor.port == port or impostor.proc.poll() is not None, timeout=EVENT_TIMEOUT)
        rc, o, e = finish(launch_node(bin_dir, config, "ts-rn", 1), timeout=60)
    finally:
        impostor.stop()
    assert impostor.received, (rc, o + e)  # it was reached
    assert secret not in impostor.received, impostor.received[:300]
    assert private_store_password(secret, "ts-rn") not in impostor.received, impostor.received[:300]
    auths = [c for c in resp_commands(impostor.received) if c[0].upper() == "AUTH"]
    assert auths and all(c[1:] == ["dflash-prove", "dflash-prove"] for c in auths), auths
    assert rc != 0 and "not the run's private store" in e, (rc, o + e)
    assert not list(out.glob("*.started"))


def test_a_store_port_squatted_before_node_0_starts_yields_nothing_that_opens_the_live_store(bin_dir, tmp_path):
    """Issue #46 item 4. Another user binds node 0's store port before node 0 starts and answers +OK to anything:
    node 1 connects to it. Then the squatter lets the port go, node 0 starts the run's real store, and the squatter
    tries every AUTH it was sent on the live store. Before: node 1 had sent AUTH HMAC(secret, run id), which
    opened the live store (read and delete node 0's registration: the run stops). Now: node 1 refuses the
    squatter (it cannot answer the challenge), and nothing it was sent reads or writes the live store."""
    out = tmp_path / "out"
    out.mkdir()
    secret = "s3cret-46-" + "y" * 24
    config = write_config(tmp_path, f'store = "private"\nstore_barrier_timeout = "20s"\n'
                                    f'store_password_file = "{secret_file(tmp_path, secret)}"\n' + waiters(out))
    plan = run([bin_dir / "dflash-launch", "check", config, "--json", "--run-id", "ts-sq46", "--nnodes", "2",
                "--node-rank", "1", "--master-addr", "127.0.0.1"])
    assert plan.returncode == 0, plan.stderr
    port = int(json.loads(plan.stdout)["run"]["store"]["url"].rsplit(":", 1)[1].split("/")[0])
    impostor = Impostor("redis", port=port)
    node1 = node0 = None
    try:
        assert wait_until(lambda: impostor.port == port or impostor.proc.poll() is not None, timeout=EVENT_TIMEOUT)
        node1 = launch_node(bin_dir, config, "ts-sq46", 1)
        assert wait_until(lambda: "AUTH" in impostor.received.upper() or node1.poll() is not None,
                          timeout=EVENT_TIMEOUT), "node 1 never reached the squatter"
        time.sleep(1)  # whatever node 1 sends after its first answer
        impostor.stop()  # the squatter lets the port go with what it got
        got = impostor.received
        node0 = launch_node(bin_dir, config, "ts-sq46", 0)
        assert wait_until(lambda: listening(port), timeout=EVENT_TIMEOUT), "node 0's store never listened"
        assert wait_until(lambda: ping(port, password=private_store_password(secret, "ts-sq46")), timeout=EVENT_TIMEOUT)
        auths = [c[1:] for c in resp_commands(got) if c[0].upper() == "AUTH"]
        assert auths, got[:300]
        opened = []
        for creds in auths:  # the squatter, now a client of the live store, with each AUTH it was sent
            for cmd in (["KEYS", "*"], ["GET", "x"], ["SET", "x", "1"], ["DEL", "dflash:ts-sq46:node:0"]):
                reply = as_nobody(sys.executable, "-c", SQUATTER_CLIENT, str(port), json.dumps(creds), json.dumps(cmd))
                if not reply.stdout.startswith(("-", "ERR")):
                    opened.append((creds, cmd, reply.stdout))
        assert not opened, opened
        assert secret not in got
    finally:
        impostor.stop()
        kill_all([p for p in (node0, node1) if p])


# A client of the live store as the squatter: AUTH with what it captured, then one command; prints the reply.
SQUATTER_CLIENT = r"""
import json, socket, sys
port, creds, cmd = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
def enc(args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
s = socket.create_connection(("127.0.0.1", port), timeout=5)
f = s.makefile("rb")
s.sendall(enc(["AUTH", *creds]))
auth = f.readline().decode(errors="replace").strip()
if not auth.startswith("+"):
    print("-" + auth)
    sys.exit(0)
s.sendall(enc(cmd))
print(f.readline().decode(errors="replace").strip())
"""


def test_a_private_store_of_several_nodes_needs_the_runs_password(bin_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, 'store = "private"\n' + waiters(out))
    rc, o, e = finish(launch_node(bin_dir, config, "ts-pn", 0), timeout=60)
    assert rc == 64, o + e
    assert "store_password_file" in e and "store_password_env" in e, e
    assert not list(out.glob("*.started"))  # nothing was started


# ---- a redis:// store with a password ----

@pytest.fixture
def protected_redis(tmp_path):
    server = RedisServer(tmp_path / "redis", password=f"pw-{os.getpid()}-{time.monotonic_ns()}").start()
    yield server
    server.kill()


def test_a_redis_store_with_a_password_file_works_and_the_password_shows_nowhere(bin_dir, tmp_path,
                                                                                 protected_redis):
    out = tmp_path / "out"
    out.mkdir()
    pw = protected_redis.password
    body = (f'store = "{protected_redis.url}"\nstore_ttl = "1s"\n'
            f'store_password_file = "{secret_file(tmp_path, pw)}"\n' + waiters(out))
    config = write_config(tmp_path, body)
    check = run([bin_dir / "dflash-launch", "check", config, "--run-id", "ts-pw", "--nnodes", "2", "--node-rank",
                 "0", "--master-addr", "127.0.0.1"])
    assert check.returncode == 0, check.stdout + check.stderr
    assert pw not in check.stdout + check.stderr
    nodes = [launch_node(bin_dir, config, "ts-pw", r) for r in (0, 1)]
    try:
        assert wait_until(lambda: started(out, 4), timeout=EVENT_TIMEOUT), "the processes did not start"
        assert not [c for c in all_cmdlines() if pw.encode() in c]
        keys = protected_redis.cmd("KEYS", "dflash:ts-pw:node:*")
        assert sorted(keys) == ["dflash:ts-pw:node:0", "dflash:ts-pw:node:1"]
        (out / "go").touch()
        got = finish_all(nodes)
    finally:
        kill_all(nodes)
    for rc, o, e in got:
        assert rc == 0, o + e
        assert pw not in o + e
    for r in (0, 1):
        assert pw not in (tmp_path / f"runs/ts-pw/node_{r}/supervisor.log").read_text()


def test_a_password_protected_store_without_the_password_says_which_key_to_set(bin_dir, tmp_path,
                                                                              protected_redis):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, f'store = "{protected_redis.url}"\n' + waiters(out))
    rc, o, e = finish(start(bin_dir, config, "ts-na"), timeout=60)
    assert rc == 69, o + e
    assert "password" in e and "store_password_file" in e, e
    assert not list(out.glob("*.started"))
    # A wrong one is refused as such.
    config = write_config(tmp_path, f'store = "{protected_redis.url}"\n'
                          f'store_password_file = "{secret_file(tmp_path, "wrong")}"\n' + waiters(out))
    rc, o, e = finish(start(bin_dir, config, "ts-np"), timeout=60)  # a run id of its own
    assert rc == 69, o + e
    assert "refused our credentials" in e and "WRONGPASS" in e and "store_password_file" in e, e
    assert "wrong" not in e.replace("WRONGPASS", "")


def test_a_secret_file_others_can_read_is_refused(bin_dir, tmp_path, protected_redis):
    out = tmp_path / "out"
    out.mkdir()
    path = secret_file(tmp_path, protected_redis.password)
    os.chmod(path, 0o644)
    config = write_config(tmp_path, f'store = "{protected_redis.url}"\nstore_password_file = "{path}"\n' + waiters(out))
    rc, o, e = finish(start(bin_dir, config, "ts-rd"), timeout=60)
    assert rc == 64, o + e
    assert "readable by others" in e and "chmod 600" in e, e


# ---- forged records, a deleted registration ----

def two_nodes(bin_dir, tmp_path, server, run_id, out, tail="exit 0"):
    body = (f'store = "{server.url}"\nstore_ttl = "1s"\n'
            f'store_password_file = "{secret_file(tmp_path, server.password)}"\n' + waiters(out, tail=tail))
    config = write_config(tmp_path, body)
    nodes = [launch_node(bin_dir, config, run_id, r) for r in (0, 1)]
    assert wait_until(lambda: started(out, 4), timeout=EVENT_TIMEOUT), "the processes did not start"
    return nodes


def test_a_forged_failure_record_naming_node_9_stops_nobody(bin_dir, tmp_path, protected_redis):
    out = tmp_path / "out"
    out.mkdir()
    nodes = two_nodes(bin_dir, tmp_path, protected_redis, "ts-f9", out)
    try:
        session = protected_redis.cmd("HGET", "dflash:ts-f9:node:0", "nonce")
        assert protected_redis.cmd("SET", f"dflash:ts-f9:{session}:failed", '{"node": 9, "exit_code": 0}') == "OK"
        # Several ttls: had it counted, both nodes would be stopping within a poll.
        assert holds_for(lambda: all(p.poll() is None for p in nodes), 3.0)
        (out / "go").touch()
        got = finish_all(nodes)
    finally:
        kill_all(nodes)
    for rc, o, e in got:
        assert rc == 0, o + e
    assert "ignored an invalid record" in (tmp_path / "runs/ts-f9/node_0/supervisor.log").read_text()


@pytest.mark.parametrize("how", ["deleted", "paused"])
def test_a_node_whose_registration_is_deleted_stops_instead_of_registering_again(bin_dir, tmp_path,
                                                                                 protected_redis, how):
    """deleted: `DEL` of node 1's registration mid-run. paused: node 1's launcher SIGSTOPped (its processes run
    on) until node 0 has seen it lost and ended, then SIGCONTed: its registration expired meanwhile."""
    out = tmp_path / "out"
    out.mkdir()
    rid = f"ts-{how}"
    nodes = two_nodes(bin_dir, tmp_path, protected_redis, rid, out)
    try:
        if how == "deleted":
            assert protected_redis.cmd("DEL", f"dflash:{rid}:node:1") == 1
            rc1, o1, e1 = finish(nodes[1], timeout=60)
            rc0, o0, e0 = finish(nodes[0], timeout=60)
        else:
            os.kill(nodes[1].pid, signal.SIGSTOP)
            rc0, o0, e0 = finish(nodes[0], timeout=60)
            os.kill(nodes[1].pid, signal.SIGCONT)
            rc1, o1, e1 = finish(nodes[1], timeout=60)
    finally:
        for p in nodes:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        kill_all(nodes)
    assert rc1 == 76, o1 + e1
    assert "vanished from the store" in o1 + e1 and "moved on without this node" in o1 + e1
    assert summary(tmp_path, rid, 1)["culprit"] == "node 1 (left behind)"
    assert rc0 == 70, o0 + e0  # deleted: node 1 told it why it left; paused: it saw node 1 lost
    assert survivors(rid) == []
    assert protected_redis.cmd("EXISTS", f"dflash:{rid}:node:1") == 0  # it did not register again
    assert "registered again" not in o1 + e1


def test_the_runs_processes_reach_the_private_store_with_the_derived_password(launch, tmp_path):
    """The cluster gate in the run's processes authenticates to a private store with the password derived from
    the secret and the run id (DFLASH_STORE_PRIVATE=1), as the launchers do: one node's shell payload leads for
    the cluster and the other node fetches its kernel through the store (no auth error, no local fallback)."""
    from test_cluster_gate import node_configs, procs, shell_role, start_node
    out = tmp_path / "out"
    out.mkdir()
    secret = secret_file(tmp_path, "cluster-secret-" + "y" * 20)
    c0, c1 = node_configs(tmp_path, f'store = "private"\nstore_password_file = "{secret}"\n' + shell_role(out))
    rid = f"ts-cg-{os.getpid()}"
    n0 = start_node(launch, c0, rid, 0, None)
    n1 = start_node(launch, c1, rid, 1, None)
    assert n0.wait(timeout=120) == 0, n0.out + n0.err
    assert n1.wait(timeout=120) == 0, n1.out + n1.err
    roles = sorted(p.read_text().strip() for p in out.glob("role.*"))
    assert roles.count("lead") == 1, roles
    cluster = sorted(p["gate"].get("cluster") for r in (n0, n1) for p in procs(r).values() if "cluster" in p["gate"])
    assert "fetched" in cluster, cluster
    for r in (n0, n1):
        assert "WRONGPASS" not in r.out + r.err and "NOAUTH" not in r.out + r.err, r.out + r.err

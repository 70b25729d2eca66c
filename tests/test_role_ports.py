"""A role's named ports (`ports = ["http"]`, docs/config.md "Ports"): one free TCP port per process and name,
reserved for the whole run the way an auto master_port is, so two runs on one host never get the same one and a
restarted process gets its own again. The process gets it as DFLASH_PORT_<NAME>, every process of the run the
role's list as DFLASH_<ROLE>_<NAME>_PORTS. Real runs, real sockets: each payload binds its port."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import uuid

import pytest
from conftest import run
from supervise import Run, wait_until, write_config

# web-serve:<r> binds DFLASH_PORT_HTTP (proving it is free and its own), records its env, and holds the port
# until the test says "release". Rank 0's first attempt exits 1 once bound: on-failure restarts it.
SERVE = r"""
import json, os, pathlib, socket, sys, time
out = pathlib.Path(sys.argv[1])
me = os.environ["DFLASH_PROCESS"].replace(":", "-") + "-" + os.environ["DFLASH_ATTEMPT"]
port = int(os.environ["DFLASH_PORT_HTTP"])
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind(("0.0.0.0", port))
    s.listen(4)
    bound = True
except OSError as e:
    bound = repr(e)
tmp = out / (me + ".tmp")
tmp.write_text(json.dumps({"env": dict(os.environ), "bound": bound}))
tmp.rename(out / (me + ".json"))
if bound is not True:
    sys.exit(3)
if os.environ["ROLE_RANK"] == "0" and os.environ["DFLASH_ATTEMPT"] == "0":
    sys.exit(1)  # fail once, holding nothing: the restart must get the same port back
while not (out / "release").exists():
    time.sleep(0.05)
"""

# client:0, of another role: what it is told about web-serve's ports.
CLIENT = r"""
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
(out / "client.tmp").write_text(json.dumps(dict(os.environ)))
(out / "client.tmp").rename(out / "client.json")
"""


def make_run(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    out = d / "out"
    out.mkdir()
    (d / "serve.py").write_text(SERVE)
    (d / "client.py").write_text(CLIENT)
    config = write_config(d, f"""
        [[role]]
        name = "web-serve"
        cpu = 2
        command = [{json.dumps(sys.executable)}, {json.dumps(str(d / "serve.py"))}, {json.dumps(str(out))}]
        ports = ["http"]
        restart = {{ policy = "on-failure", max = 2, window = "1h", backoff = "100ms..100ms" }}

        [[role]]
        name = "client"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(d / "client.py"))}, {json.dumps(str(out))}]
        """, name=name)
    return config, out


def test_two_concurrent_runs_get_distinct_ports_listed_to_peers_and_kept_across_a_restart(bin_dir, tmp_path):
    runs = []
    for name in ("ports-a", "ports-b"):
        config, out = make_run(tmp_path, name)
        runs.append((Run(bin_dir, config, run_id=f"{name}-{uuid.uuid4().hex[:8]}"), out))
    expect = ["web-serve-0-0", "web-serve-0-1", "web-serve-1-0"]  # rank 0 twice (the restart), rank 1 once
    try:
        # Both runs hold their ports at once: every server of both is bound before either is released.
        for r, out in runs:
            done = wait_until(lambda: r.proc.poll() is not None or (
                all((out / f"{e}.json").exists() for e in expect) and (out / "client.json").exists()), timeout=120)
            assert done and r.proc.poll() is None, f"{r.run_id} ended early: " + " ".join(r.proc.communicate())
        seen = []
        for r, out in runs:
            got = {e: json.loads((out / f"{e}.json").read_text()) for e in expect}
            for e, g in got.items():
                assert g["bound"] is True, (e, g["bound"])  # the port was free and the process's own
            p0, p0_again, p1 = (int(got[e]["env"]["DFLASH_PORT_HTTP"]) for e in expect)
            assert p0_again == p0, "a restarted process keeps its port: it is reserved for the run"
            assert p0 != p1
            listed = f"{p0},{p1}"
            client = json.loads((out / "client.json").read_text())
            assert client["DFLASH_WEB_SERVE_HTTP_PORTS"] == listed  # a process of another role finds them
            assert "DFLASH_PORT_HTTP" not in client  # client names no port of its own
            assert all(g["env"]["DFLASH_WEB_SERVE_HTTP_PORTS"] == listed for g in got.values())
            seen += [p0, p1]
        assert len(set(seen)) == 4, f"two concurrent runs shared a port: {seen}"
    finally:
        for r, out in runs:
            (out / "release").write_text("")
    for r, out in runs:
        assert r.wait(timeout=120) == 0, r.err
        summary = r.summary()
        ports = {p["name"]: p["ports"] for p in summary["processes"]}
        got0 = json.loads((out / "web-serve-0-1.json").read_text())["env"]["DFLASH_PORT_HTTP"]
        assert ports["web-serve:0"] == {"http": int(got0)}
        assert ports["client:0"] == {}
        assert [p["restarts"] for p in summary["processes"] if p["name"] == "web-serve:0"] == [1]


def test_check_shows_each_roles_port_names_and_their_variables(bin_dir, tmp_path):
    config, _ = make_run(tmp_path, "ports-check")
    r = run([bin_dir / "dflash-launch", "check", config, "--json"])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    roles = {x["name"]: x for x in plan["roles"]}
    assert roles["web-serve"]["ports"] == [{"name": "http", "env": "DFLASH_PORT_HTTP",
                                            "list_env": "DFLASH_WEB_SERVE_HTTP_PORTS", "ports": [None, None]}]
    assert roles["client"]["ports"] == []
    procs = {p["name"]: p for p in plan["processes"]}
    assert procs["web-serve:1"]["env"]["DFLASH_PORT_HTTP"] == "<auto>"
    assert procs["client:0"]["env"]["DFLASH_WEB_SERVE_HTTP_PORTS"] == "<auto>,<auto>"
    text = run([bin_dir / "dflash-launch", "check", config])
    assert text.returncode == 0, text.stderr
    assert "ports    http (DFLASH_PORT_HTTP, all: DFLASH_WEB_SERVE_HTTP_PORTS)" in text.stdout, text.stdout


def test_a_bad_port_name_is_a_config_error_at_its_place(bin_dir, tmp_path):
    config = write_config(tmp_path, """
        [[role]]
        name = "p"
        cpu = 1
        command = ["true"]
        ports = ["http", "Http"]
        """)
    r = run([bin_dir / "dflash-launch", "run", config])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{config}:10:18: error: role[p].ports: not a valid port name" in r.stderr, r.stderr
    assert "hint:" in r.stderr and "nothing was started" in r.stderr


def test_ports_that_cannot_be_reserved_are_an_error_before_anything_is_spawned(bin_dir, tmp_path):
    """Out of file descriptors for the port locks (a hard limit that would do for 3 processes, but not with
    3 x 15 held locks): the fd budget warns, then exit 73 naming the port, and no payload ran."""
    import resource
    marker = tmp_path / "ran"
    names = ", ".join(f'"p{i}"' for i in range(15))
    config = write_config(tmp_path, f"""
        [[role]]
        name = "p"
        cpu = 3
        command = ["touch", {json.dumps(str(marker))}]
        ports = [{names}]
        """)
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (47, 47))  # FdsNeeded(3) = 47
    r = subprocess.run([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", f"fd-{uuid.uuid4().hex[:8]}"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 73, r.stdout + r.stderr
    assert "cannot reserve ports: port \"p" in r.stderr and "Too many open files" in r.stderr, r.stderr
    assert "nothing was started" in r.stderr, r.stderr
    assert "3 processes and 45 named ports need ~" in r.stderr, r.stderr  # the launcher's fd budget said so first
    assert not marker.exists()


def test_two_node_launchers_reserve_each_nodes_ports_there_and_list_their_own(bin_dir, tmp_path):
    """Static mode, two node launchers on one host: each reserves its own processes' ports, and the role's
    _PORTS list holds this node's processes only (docs/multinode.md: the nodes do not exchange them)."""
    out = tmp_path / "out"
    out.mkdir()
    payload = (
        "import json, os, pathlib, socket; s = socket.socket(); s.bind(('0.0.0.0', int(os.environ['DFLASH_PORT_HTTP'])));"
        f"p = pathlib.Path({str(out)!r}) / os.environ['DFLASH_PROCESS'].replace(':', '-');"
        "p.with_suffix('.tmp').write_text(json.dumps(dict(os.environ))); p.with_suffix('.tmp').rename(p)")
    config = write_config(tmp_path, f"""
        [[role]]
        name = "s"
        cpu = 2
        command = [{json.dumps(sys.executable)}, "-c", {json.dumps(payload)}]
        ports = ["http"]
        """)
    nodes = [subprocess.Popen([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", "mn", "--nnodes", "2",
                               "--node-rank", str(r), "--master-addr", "127.0.0.1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for r in (0, 1)]
    for p in nodes:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    env = {n: json.loads((out / f"s-{n}").read_text()) for n in range(4)}  # s:0, s:1 on node 0; s:2, s:3 on node 1
    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        mine = [env[n]["DFLASH_PORT_HTTP"] for n in ranks]
        for n in ranks:
            assert env[n]["DFLASH_NODE_RANK"] == str(node)
            assert env[n]["DFLASH_S_HTTP_PORTS"] == ",".join(mine)  # this node's processes, role-rank order
        summary = json.loads((tmp_path / f"runs/mn/node_{node}/summary.json").read_text())
        assert [p["ports"]["http"] for p in summary["processes"]] == [int(x) for x in mine]


# ---- another user on a reserved port (issue #38 item 2) ----

# A server that loads for a while before it binds its DFLASH_PORT_HTTP, then serves "real": the window in which
# another user who watched the port's lock file appear can bind it first.
SLOW_SERVER = r"""
import os, socket, sys, time
port = int(os.environ["DFLASH_PORT_HTTP"])
time.sleep(float(sys.argv[1]))
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError as e:
    print(f"cannot bind {port}: {e}", flush=True)
    sys.exit(3)
s.listen(8)
s.settimeout(10)  # then it ends, whatever happened: the run always does
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nreal")
    c.close()
"""

# The dependent role: reads srv's port once srv is ready (after = ["srv"]).
READER = r"""
import os, pathlib, sys, urllib.request
port = os.environ["DFLASH_SRV_HTTP_PORTS"].split(",")[0]
data = urllib.request.urlopen(f"http://127.0.0.1:{port}/data", timeout=5).read()
pathlib.Path(sys.argv[1]).write_bytes(data)
"""


def test_another_users_listener_on_a_reserved_port_never_makes_the_role_ready(bin_dir, tmp_path):
    """Before: another user bound srv's reserved port first, answered the readiness probe, srv was judged ready,
    the reader read the impostor's data and the run ended 0. Now: a try counts only if srv's own process tree
    accepted it (and then holds the port's listener); srv is never ready, the reader never starts, the squatter
    gets no request, and the reason names it (uid, pid): srv's own exit (3: it could not bind) is the run's."""
    from impostor import Impostor
    (tmp_path / "slow.py").write_text(SLOW_SERVER)
    (tmp_path / "reader.py").write_text(READER)
    got = tmp_path / "read"
    config = write_config(tmp_path, f"""
        [[role]]
        name = "srv"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "slow.py"))}, "5"]
        ports = ["http"]
        ready = {{ mode = "http", url = "http://127.0.0.1:{{http}}/health", interval = "100ms", timeout = "10s" }}

        [[role]]
        name = "reader"
        cpu = 1
        after = ["srv"]
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "reader.py"))}, {json.dumps(str(got))}]
        """)
    # srv binds after 5 s: time for the impostor (another user's process, told the port from its lock file) to take
    # it first. On a loaded machine it may still lose that race (then srv binds, the run is a plain one and nothing
    # was attacked): the scenario is set up again under a new run id, up to 3 times; every assertion below is on
    # the attempt where the impostor held the port and the probe reached it.
    tries = []
    for attempt in range(3):
        run_id = f"rp-sq{attempt}"
        impostor = Impostor("http", match=f"run {run_id},", body="impostor")
        try:
            r = run([bin_dir / "dflash-launch", "run", config, "--run-id", run_id, "--color", "never"], timeout=120)
        finally:
            impostor.stop()
        if impostor.ports and impostor.said("accepted"):
            break
        tries.append((impostor.events, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))
        if got.exists():
            got.unlink()  # srv's own data: the impostor lost the race
    else:
        pytest.fail(f"the impostor never held srv's port while the probe tried, in 3 attempts: {tries}")
    print(f"squatter scenario: {len(tries)} attempt(s) before the impostor held the port: {tries}")
    assert not got.exists(), f"the reader read {got.read_bytes()!r} from another user's server"
    said = r.stdout + r.stderr
    assert r.returncode == 3 and "cannot bind" in said, said
    # Since issue #46 item 2 the squatter is caught when it accepts, before any request is sent to it.
    assert "accepted by uid 65534 (nobody), pid" in said and "not by this process" in said, said
    assert not impostor.said("got"), impostor.said("got")
    events = [json.loads(line) for line in (tmp_path / f"runs/{run_id}/events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e.get("process") == "srv:0" and e.get("state") == "RUNNING"], events


# ---- a probe answered by whoever accepted it (issue #46 item 2) ----

# srv: after a second, binds its port as soon as it is free and answers every request 503 (never ready), for at
# most 20 s.
NEVER_READY = r"""
import os, socket, time
port = int(os.environ["DFLASH_PORT_HTTP"])
time.sleep(1)  # it loads a while first: the window a squatter who learned the port uses
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
end = time.time() + 20
while True:
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.02)  # the squatter holds it for now
print("bound", flush=True)
s.listen(8)
s.settimeout(0.2)
while time.time() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.settimeout(2)
    try:
        c.recv(65536)
        c.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
    except OSError:
        pass
    c.close()
"""

# The squatter (another user): binds every port it is told (the run's port locks: its master port and srv's), accepts
# the first connection, lets the ports go, waits until someone else listens on that port (the real server), then
# answers the connection it kept: 200.
HANDOVER = r"""
import json, select, socket, sys, time
def say(**kw):
    print(json.dumps(kw), flush=True)
stdin = sys.stdin.buffer.raw
listeners, conn, port = {}, None, None
while conn is None:
    ready, _, _ = select.select([stdin, *listeners], [], [], 1)
    for r in ready:
        if r is stdin:
            for p in r.readline().split():
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", int(p)))
                s.listen(8)
                listeners[s] = int(p)
                say(bound=int(p))
        elif conn is None:
            conn, _ = r.accept()
            port = listeners[r]
for s in listeners:
    s.close()
say(accepted=port)
def listening():
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(":%04X" % port) and f[3] == "0A":
            return True
    return False
while not listening():
    time.sleep(0.01)
conn.settimeout(5)
try:
    got = conn.recv(65536)
except OSError:
    got = b""
conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nimpostor")
say(answered=True, got=got.decode("latin-1"))
conn.close()
time.sleep(30)
"""


def test_a_probe_accepted_by_a_squatter_that_hands_the_port_over_never_makes_the_role_ready(bin_dir, tmp_path):
    """Issue #46 item 2. Another user binds srv's reserved port first, accepts the readiness probe, lets the port
    go, and answers 200 once srv (which only ever answers 503) has bound it. Before: the answer counted, since the
    listener proven after it was srv's: srv was judged ready and the run ended 0. Now: the socket that accepted
    the probe is proven before the request is sent, the squatter's fails the try naming it, and srv is never
    ready (exit 75, ready timeout)."""
    import impostor as imp
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root and setpriv to act as another user")
    (tmp_path / "srv.py").write_text(NEVER_READY)
    config = write_config(tmp_path, f"""
        [[role]]
        name = "srv"
        cpu = 1
        command = [{json.dumps(sys.executable)}, {json.dumps(str(tmp_path / "srv.py"))}]
        ports = ["http"]
        ready = {{ mode = "http", url = "http://127.0.0.1:{{http}}/health", interval = "100ms", probe_timeout = "5s", timeout = "8s" }}
        """)
    squatter = subprocess.Popen(["setpriv", f"--reuid={imp.NOBODY}", f"--regid={imp.NOBODY}", "--clear-groups",
                                 "/usr/bin/python3", "-c", HANDOVER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    said = []
    seen = imp.lock_stamps()
    run_id = f"rp-ho-{uuid.uuid4().hex[:6]}"
    launcher = subprocess.Popen([bin_dir / "dflash-launch", "run", config, "--run-id", run_id, "--color", "never"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        told = set()

        def tell():  # the run's ports, as their locks appear: the test plays a squatter who learned them
            while launcher.poll() is None:
                for path, stamp in imp.lock_stamps().items():
                    if stamp[1] and seen.get(path) != stamp:
                        seen[path] = stamp
                        try:
                            mine = f"run {run_id}," in open(path).read()
                        except OSError:
                            continue
                        port = int(os.path.basename(path).split(".")[0])
                        if mine and port not in told:
                            told.add(port)
                            squatter.stdin.write(f"{port}\n")
                            squatter.stdin.flush()
                time.sleep(0.005)
        teller = threading.Thread(target=tell, daemon=True)
        teller.start()
        out, _ = launcher.communicate(timeout=120)
        teller.join(timeout=10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        os.killpg(squatter.pid, 9)
        said = [json.loads(line) for line in squatter.communicate()[0].splitlines() if line.startswith("{")]
    summary = json.loads((tmp_path / f"runs/{run_id}/summary.json").read_text())
    port = summary["processes"][0]["ports"]["http"]
    assert {"bound": port} in said, (said, out)  # it was first on srv's port
    assert {"accepted": port} in said, (said, out)  # and the probe reached it
    events = [json.loads(line) for line in (tmp_path / f"runs/{run_id}/events.jsonl").read_text().splitlines()]
    ready = [e for e in events if e.get("process") == "srv:0" and e.get("state") == "RUNNING"]
    assert not ready, (ready, out)
    assert launcher.returncode == 75, out
    assert "accepted by uid 65534 (nobody)" in out and "not by this process" in out, out

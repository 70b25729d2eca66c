"""Another local user's server on a port a run meant for itself (issue #38 items 1 and 2): run as uid 65534
through setpriv, it binds the port it is told, or every port whose lock file in /tmp/dflash-ports gets a record
that holds `match` after it started (it watches them, as an attacker would), then records every byte
sent to it and answers like a Redis server (+OK to anything; or "refuse": WRONGPASS, then it closes) or an HTTP
server (200 and `body`)."""
import json
import os
import shutil
import subprocess
import threading

import pytest

from supervise import EVENT_TIMEOUT, wait_until

NOBODY = 65534

SCRIPT = r"""
import json, os, select, socket, sys, time
mode, port, match, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def say(**kw):
    print(json.dumps(kw), flush=True)
locks = "/tmp/dflash-ports"
def stamps():
    try:
        return {e.name: (e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(locks)}
    except OSError:
        return {}
seen = stamps()  # a lock file is kept after its run: a port used before has one already, with an old record
listeners, conns = [], []
def listen(p):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
    except OSError as e:
        say(failed=p, error=str(e))
        return
    s.listen(16)
    listeners.append(s)
    say(bound=p)
if port:
    listen(port)
say(watching=True)
while True:
    if not port:
        for name, stamp in stamps().items():
            if stamp[1] == 0 or seen.get(name) == stamp:
                continue  # not written yet, or not written since we started looking
            seen[name] = stamp
            try:
                record = open(os.path.join(locks, name)).read()
            except OSError:
                continue
            if match in record:
                listen(int(name.split(".")[0]))
    ready, _, _ = select.select(listeners + conns, [], [], 0.02 if not port else 0.5)
    for r in ready:
        if r in listeners:
            c, _ = r.accept()
            conns.append(c)
            say(accepted=True)
            continue
        data = r.recv(65536)
        if not data:
            conns.remove(r)
            r.close()
            continue
        say(got=data.decode("latin-1"))
        if mode == "refuse":  # a Redis that turns every password down: the client gives up at once
            r.sendall(b"-WRONGPASS invalid username-password pair\r\n")
            conns.remove(r)
            r.close()
        elif mode == "redis":
            r.sendall(b"+OK\r\n" * max(1, data.count(b"\r\n*") + data.startswith(b"*")))
        else:
            r.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
            conns.remove(r)
            r.close()
"""


class Impostor:
    """The server; .events is what it said (watching, bound, accepted, got), .received every byte it got."""

    def __init__(self, mode, port=0, match="", body="impostor"):
        if os.geteuid() != 0 or shutil.which("setpriv") is None:
            pytest.skip("needs root and setpriv to act as another user")
        self.events = []
        self.proc = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-c", SCRIPT,
             mode, str(port), match, body],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert wait_until(lambda: self.said("watching") or self.proc.poll() is not None, timeout=EVENT_TIMEOUT)

    def _read(self):
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def said(self, key):
        return [e[key] for e in list(self.events) if key in e]

    @property
    def port(self):
        bound = self.said("bound")
        return bound[0] if bound else None

    @property
    def ports(self):
        return self.said("bound")

    @property
    def received(self):
        return "".join(self.said("got"))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self._reader.join(timeout=5)

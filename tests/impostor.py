"""Another local user's server on a port a run meant for itself (issue #38 items 1 and 2): run as uid 65534
through setpriv, it binds the port it is told, or every port whose lock file gets a record that holds `match`
after it started, then records every byte sent to it and answers like a Redis server (+OK to anything; or
"refuse": WRONGPASS, then it closes) or an HTTP server (200 and `body`).

The lock files were in the shared /tmp/dflash-ports, where the attacker read them itself; since issue #46 item 5
they are in the launcher user's private directory, so the test (root, the launcher's user) watches them and
tells the impostor the port on its stdin: it plays an attacker who learned the port anyway (a guess, a scan)."""
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from supervise import EVENT_TIMEOUT, wait_until

NOBODY = 65534
# Where a launcher of this user keeps its port locks (launcher/plan/port_reservation.h PortLockDir), and the
# shared directory of the launchers before issue #46.
LOCK_DIRS = [f"/tmp/dflash-ports-{os.geteuid()}", "/tmp/dflash-ports"]


def lock_stamps():
    out = {}
    for d in LOCK_DIRS:
        try:
            for e in os.scandir(d):
                st = e.stat(follow_symlinks=False)
                out[os.path.join(d, e.name)] = (st.st_mtime_ns, st.st_size)
        except OSError:
            pass
    return out

SCRIPT = r"""
import json, os, select, socket, sys, time
mode, port, match, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def say(**kw):
    print(json.dumps(kw), flush=True)
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
stdin = [sys.stdin.buffer.raw]  # the ports the test tells it, one a line; gone at EOF
while True:
    ready, _, _ = select.select(listeners + conns + stdin, [], [], 0.5)
    if stdin and stdin[0] in ready:
        ready.remove(stdin[0])
        line = stdin[0].readline()
        if not line:
            stdin = []
        elif line.strip():
            listen(int(line))
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
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._stop = threading.Event()
        if not port:
            # The snapshot before the constructor returns: taken in the thread, a run started meanwhile could write
            # its lock files while the (thousands of) old ones are listed, and they would count as old.
            seen = lock_stamps()  # a lock file is kept after its run: a port used before has one, with an old record
            self._watcher = threading.Thread(target=self._watch, args=(match, seen), daemon=True)
            self._watcher.start()
        assert wait_until(lambda: self.said("watching") or self.proc.poll() is not None, timeout=EVENT_TIMEOUT)

    def _watch(self, match, seen):
        """Every lock file written after `seen` was taken whose record holds `match`: its port to the impostor."""
        while not self._stop.is_set():
            for path, stamp in lock_stamps().items():
                if stamp[1] == 0 or seen.get(path) == stamp:
                    continue  # not written yet, or not written since we started looking
                seen[path] = stamp
                try:
                    record = open(path).read()
                except OSError:
                    continue
                if match in record:
                    try:
                        self.proc.stdin.write(os.path.basename(path).split(".")[0] + "\n")
                        self.proc.stdin.flush()
                    except OSError:
                        return
            time.sleep(0.01)

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
        self._stop.set()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self._reader.join(timeout=5)

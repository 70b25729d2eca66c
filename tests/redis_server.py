"""A private redis-server on loopback for the tests of the multi-node store and the cluster-wide gate
(Debian's redis-server; scripts/setup installs it). No persistence: `restart()` brings it back on the
same port, empty, as a Redis restarted without persistence comes back. `password`: required of clients,
given in a 0600 config file (never argv); `cmd()` speaks RESP with it."""
import os
import pathlib
import shutil
import socket
import subprocess
import time

from supervise import wait_until


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port, timeout=0.5, password=None):
    """True if a Redis answers PING on 127.0.0.1:port (plain RESP, no client library needed)."""
    try:
        return resp(port, "PING", password=password, timeout=timeout) == "PONG"
    except OSError:
        return False


def listening(port):
    """True if anything accepts a TCP connection on 127.0.0.1:port (a password-protected Redis too)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _reply(f):
    line = f.readline().rstrip(b"\r\n")
    kind, rest = line[:1], line[1:]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        return "-" + rest.decode()  # an error reply: "-NOAUTH Authentication required."
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_reply(f) for _ in range(n)]
    return f"CLOSED {line!r}"


def resp(port, *args, password=None, timeout=5):
    """One command on a fresh connection (AUTH first with `password`); an error reply comes back as
    "-<text>", a closed connection as "CLOSED ..."."""
    def enc(*a):
        return b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in (str(v).encode() for v in a))
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        f = s.makefile("rb")
        if password:
            s.sendall(enc("AUTH", password))
            got = _reply(f)
            if got != "OK":
                return got
        s.sendall(enc(*args))
        return _reply(f)


class RedisServer:
    def __init__(self, dir, password=None):
        self.dir = pathlib.Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc = None
        self.password = password

    def cmd(self, *args):
        return resp(self.port, *args, password=self.password)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _start_on(self, port):
        log = open(self.dir / "redis.log", "ab")
        conf = []
        if self.password:
            path = self.dir / "redis.conf"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, f"requirepass {self.password}\n".encode())
            os.close(fd)
            conf = [str(path)]
        self.proc = subprocess.Popen(
            ["redis-server", *conf, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--daemonize", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        ok = wait_until(lambda: self.proc.poll() is not None or ping(port, password=self.password), timeout=20)
        if ok and self.proc.poll() is None:
            self.port = port
            return True
        self.kill()
        return False

    def start(self):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed: run scripts/setup")
        for _ in range(5):  # the free port may be taken before redis binds it
            if self._start_on(free_port()):
                return self
        raise RuntimeError(f"redis-server did not come up; see {self.dir / 'redis.log'}")

    def kill(self):
        """SIGKILL: a crash, nothing flushed."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()

    def restart(self):
        port = self.port
        self.kill()
        deadline = time.monotonic() + 20
        while not self._start_on(port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not come back on {port}")
        return self

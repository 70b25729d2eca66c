"""A private redis-server on loopback for the tests of the multi-node store and the cluster-wide gate
(Debian's redis-server; scripts/setup installs it). No persistence: `restart()` brings it back on the
same port, empty, as a Redis restarted without persistence comes back."""
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


def ping(port, timeout=0.5):
    """True if a Redis answers PING on 127.0.0.1:port (plain RESP, no client library needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, dir):
        self.dir = pathlib.Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def _start_on(self, port):
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--daemonize", "no", "--loglevel", "warning"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        ok = wait_until(lambda: self.proc.poll() is not None or ping(port), timeout=20)
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

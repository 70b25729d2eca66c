"""Just enough of the Redis protocol (RESP2) for the stack's bulk path: AUTH, SET with an expiry, GET,
DEL, PING over one TCP connection. Binary-safe; no client library needed (redis-py is not a dependency)."""
import socket


class Redis:
    def __init__(self, port, host="127.0.0.1", password=None, timeout=10.0):
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.f = self.sock.makefile("rb")
        if password:
            self.cmd("AUTH", password)

    def close(self):
        self.f.close()
        self.sock.close()

    def cmd(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += [b"$%d\r\n" % len(a), a, b"\r\n"]
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _reply(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis: connection closed")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("redis: short reply")
            return data[:-2]
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

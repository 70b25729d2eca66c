#!/usr/bin/env python3
"""The Python peers of cachelock_bench, measured the same way.

    peers.py --what uncontended|handoff --impl filelock|lockf --n N --dir DIR

Prints one JSON line like cachelock_bench. `filelock` is the PyPI package with
its defaults (FileLock(path): blocking, polls every 0.05 s); `lockf` is a
blocking fcntl.lockf(LOCK_EX), which the kernel hands over directly.

Hand-off protocol (as in cachelock_bench.cc): two forked processes take strict
turns; the holder waits until the other announces it is about to block, sleeps
1 ms more, stamps CLOCK_MONOTONIC and releases, and does not ask again until the
other holds; the other stamps when its acquire returns.
"""
import argparse
import fcntl
import json
import mmap
import os
import struct
import sys
import time

# Shared page layout: started, done, count, waiting[0], waiting[1], t_release, owner, samples[n]
HEADER = struct.Struct("qqqqqqq")


class Shared:
    def __init__(self, n):
        self.mem = mmap.mmap(-1, HEADER.size + 8 * (n + 1))

    def get(self, i):
        return struct.unpack_from("q", self.mem, 8 * i)[0]

    def set(self, i, v):
        struct.pack_into("q", self.mem, 8 * i, v)

    def sample(self, i, v):
        struct.pack_into("q", self.mem, HEADER.size + 8 * i, v)

    def samples(self, n):
        return list(struct.unpack_from("%dq" % n, self.mem, HEADER.size))


STARTED, DONE, COUNT, WAITING0, WAITING1, T_RELEASE, OWNER = range(7)


def make_lock(impl, directory):
    path = os.path.join(directory, "peer.lock")
    if impl == "filelock":
        import filelock

        lock = filelock.FileLock(path)  # defaults: timeout=-1, poll_interval=0.05
        return lock.acquire, lock.release
    if impl == "lockf":
        f = open(path, "a+")
        return (lambda: fcntl.lockf(f, fcntl.LOCK_EX)), (lambda: fcntl.lockf(f, fcntl.LOCK_UN))
    sys.exit("unknown --impl " + impl)


def player(me, impl, directory, s, n):
    acquire, release = make_lock(impl, directory)
    holding = False
    if me == 0:
        acquire()
        holding = True
        s.set(STARTED, 1)
    else:
        while not s.get(STARTED):
            time.sleep(0.00002)
    other = WAITING0 + (1 - me)
    while True:
        if holding:
            while not s.get(other):  # sleep-polls, as cachelock_bench does
                time.sleep(0.00002)
            time.sleep(0.001)
            if s.get(COUNT) >= n:
                s.set(DONE, 1)
            s.set(T_RELEASE, time.monotonic_ns())
            release()
            holding = False
            if s.get(DONE):
                return
            while s.get(OWNER) == me:  # strict turns: never take it straight back
                time.sleep(0.00002)
        else:
            s.set(WAITING0 + me, 1)
            acquire()
            t1 = time.monotonic_ns()
            s.set(OWNER, me)
            s.set(WAITING0 + me, 0)
            if s.get(DONE):
                release()
                return
            count = s.get(COUNT)
            s.sample(count, t1 - s.get(T_RELEASE))
            s.set(COUNT, count + 1)
            holding = True


def report(impl, what, ns):
    ns = sorted(ns)
    pct = lambda p: ns[min(len(ns) - 1, int(p * len(ns)))] / 1e3
    print(json.dumps({"impl": impl, "what": what, "n": len(ns), "p50_us": round(pct(0.50), 2),
                      "p99_us": round(pct(0.99), 2), "mean_us": round(sum(ns) / len(ns) / 1e3, 2),
                      "max_us": round(ns[-1] / 1e3, 1)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", default="handoff", choices=["uncontended", "handoff"])
    ap.add_argument("--impl", default="filelock", choices=["filelock", "lockf"])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    if a.what == "uncontended":
        acquire, release = make_lock(a.impl, a.dir)
        ns = []
        for i in range(a.n + 100):
            t0 = time.monotonic_ns()
            acquire()
            release()
            if i >= 100:
                ns.append(time.monotonic_ns() - t0)
        report(a.impl, a.what, ns)
        return
    s = Shared(a.n)
    kids = []
    for me in (0, 1):
        pid = os.fork()
        if pid == 0:
            try:
                player(me, a.impl, a.dir, s, a.n)
            finally:
                os._exit(0)
        kids.append(pid)
    for pid in kids:
        _, status = os.waitpid(pid, 0)
        if status != 0:
            sys.exit("a hand-off player failed")
    report(a.impl, a.what, s.samples(a.n))


if __name__ == "__main__":
    main()

"""The payload of tests/test_pause.py, steered by files in $PAUSE_DIR (the test
writes them; nothing here sleeps to let something happen).

  pause_payload.py ping     WATCHDOG=1 every 0.2 s; writes "pinging" after the
                            first; exits 0 once "done" exists, stops pinging
                            for good (hangs) once "hang" exists.
  pause_payload.py ready    waits until its parent (the supervisor) is stopped,
                            then sends READY=1 and writes "sent"; exits 0 once
                            the supervisor runs again and "done" exists.
  pause_payload.py resumed  writes "started"; prints "resumed" once it sees
                            its own clock jump (it was stopped), then exits 0
                            once "done" exists.
"""
import os
import pathlib
import sys
import time

import dflash_launch

DIR = pathlib.Path(os.environ["PAUSE_DIR"])


def mark(name):
    (DIR / (name + ".tmp")).write_text(str(os.getpid()))
    os.replace(DIR / (name + ".tmp"), DIR / name)


def parent_state():
    stat = open(f"/proc/{os.getppid()}/stat").read()
    return stat[stat.rindex(")") + 2:].split()[0]


def hang():
    while True:
        time.sleep(1000)


if sys.argv[1] == "ping":
    print("pinging every 0.2s", flush=True)
    first = True
    while not (DIR / "done").exists():
        if (DIR / "hang").exists():
            print("no more pings", flush=True)
            hang()
        assert dflash_launch.notify_watchdog()
        if first:
            mark("pinging")
            first = False
        time.sleep(0.2)
    print("done", flush=True)
elif sys.argv[1] == "ready":
    mark("started")
    while parent_state() != "T":
        time.sleep(0.02)
    assert dflash_launch.notify_ready()
    mark("sent")
    while parent_state() == "T" or not (DIR / "done").exists():
        time.sleep(0.02)
    print("done", flush=True)
elif sys.argv[1] == "resumed":
    mark("started")
    last = time.monotonic()
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        if now - last > 1.0:
            break
        last = now
    print("resumed", flush=True)
    while not (DIR / "done").exists():
        time.sleep(0.02)
    print("done", flush=True)

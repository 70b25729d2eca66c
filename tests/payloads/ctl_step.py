"""A cheap stand-in for a training rank (tests/test_ctl.py, bench/ctl): ready at
once, then "step k" on stdout and as STATUS= every STEP_S seconds, STEPS times
(forever if 0). Stdlib only, so it runs under any interpreter."""
import os
import signal
import socket
import sys
import time


def notify(msg):
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(msg.encode(), path)


def main():
    name = os.environ.get("DFLASH_PROCESS", "?")
    step_s = float(os.environ.get("STEP_S", "0.5"))
    steps = int(os.environ.get("STEPS", "0"))
    # `ctl signal USR1 ...` is seen in the output (tests/test_ctl.py).
    signal.signal(signal.SIGUSR1, lambda *_: print(f"{name}: got SIGUSR1", flush=True))
    notify("READY=1")
    k = 0
    while steps == 0 or k < steps:
        k += 1
        text = f"step {k} loss {3.0 / k:.3f}"
        print(f"{name}: {text}", flush=True)
        notify(f"STATUS={text}")
        time.sleep(step_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sends WATCHDOG=1 (dflash_launch.notify_watchdog) every 0.1 s. On attempt 0 it
stops pinging after a few and hangs in stuck_in_collective(), as a rank stuck
in a collective would; on later attempts it pings a few times and exits 0."""
import os
import time

import dflash_launch


def stuck_in_collective():
    while True:
        time.sleep(1000)


attempt = int(os.environ["DFLASH_ATTEMPT"])
print(f"pinging every 0.1s (interval {dflash_launch.watchdog_interval()}s), attempt {attempt}", flush=True)
for _ in range(5):
    assert dflash_launch.notify_watchdog()
    time.sleep(0.1)
if attempt == 0:
    print("no more pings", flush=True)
    stuck_in_collective()
print("done", flush=True)

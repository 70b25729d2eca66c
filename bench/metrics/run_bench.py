"""What serving metrics costs a run (docs/metrics.md): the launcher's CPU over an idle stretch of a run of N
sleeping processes with [run] metrics on (filled every 2 s, scraped every second here) against the same run with
metrics = false, in the same invocation; and the latency of a scrape.

    python3 bench/metrics/run_bench.py [--bin build/bin] [--procs 8] [--seconds 60] [--out docs/benchmarks.md]
"""
import argparse
import os
import pathlib
import signal
import statistics
import subprocess
import tempfile
import textwrap
import time
import urllib.request

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICKS  # utime, stime (fields 14, 15)


def one(bin_dir, procs, seconds, metrics):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "cache").mkdir()
        cfg = tmp / "run.toml"
        cfg.write_text(textwrap.dedent(f"""\
            [run]
            name = "bench"
            cache_dir = "cache"
            log_dir = "runs"
            metrics = {"true" if metrics else "false"}
            [[role]]
            name = "w"
            cpu = {procs}
            command = ["sleep", "3600"]
            stop = {{ grace = "5s" }}
            """))
        p = subprocess.Popen([str(bin_dir / "dflash-launch"), "run", str(cfg), "--run-id", "b"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            status = tmp / "runs/b/events.jsonl"
            deadline = time.time() + 60
            while time.time() < deadline and not (status.exists() and status.read_text().count('"RUNNING"') >= procs):
                time.sleep(0.1)
            url_file = tmp / "runs/b/metrics.url"
            url = url_file.read_text().strip() if metrics else None
            start = cpu_s(p.pid)
            latencies = []
            end = time.time() + seconds
            while time.time() < end:
                if url:
                    t0 = time.perf_counter()
                    with urllib.request.urlopen(url, timeout=10) as r:
                        r.read()
                    latencies.append(time.perf_counter() - t0)
                time.sleep(1)
            used = cpu_s(p.pid) - start
        finally:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=120)
        return used, latencies


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--out")
    a = ap.parse_args()
    bin_dir = pathlib.Path(a.bin).resolve()
    on, lat = one(bin_dir, a.procs, a.seconds, True)
    off, _ = one(bin_dir, a.procs, a.seconds, False)
    lat_ms = sorted(x * 1000 for x in lat)
    text = (f"\n## Metrics: what serving them costs a run\n\n"
            f"`python3 bench/metrics/run_bench.py --procs {a.procs} --seconds {a.seconds:g}` ({time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} CPUs, shared): a run of {a.procs} sleeping processes, idle for {a.seconds:g} s.\n\n"
            f"| | launcher CPU | per minute |\n|---|---|---|\n"
            f"| metrics on (filled every 2 s, scraped every 1 s) | {on:.2f} s | {on / a.seconds * 60:.2f} s |\n"
            f"| metrics = false (the peer) | {off:.2f} s | {off / a.seconds * 60:.2f} s |\n\n"
            f"On - off: {on - off:.2f} s of CPU in {a.seconds:g} s ({(on - off) / a.seconds * 100:.2f}% of a core). "
            f"A scrape: median {statistics.median(lat_ms):.1f} ms, max {lat_ms[-1]:.1f} ms over {len(lat_ms)} "
            f"(loopback HTTP, urllib).\n")
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()

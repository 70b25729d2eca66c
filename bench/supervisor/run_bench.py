#!/usr/bin/env python3
"""dflash-launch against torchrun (--standalone --nproc-per-node 8 --no-python),
in the same run, on the same trivial payload (bench_payload):

  (1) start -> all 8 payloads running (the last one's main() clock, minus the launch)
  (2) a payload's death -> the supervisor notices (its log) / -> the launcher has exited
  (3) log throughput: 8 payloads x MB of 100-byte lines into per-process files, 0 lost
  (4) supervisor RSS and CPU while 8 payloads sleep

Usage: python3 bench/supervisor/run_bench.py [--bin build/bin] [--torchrun .venv/bin/torchrun]
       [--rounds 20] [--log-mb 64] [--out docs/benchmarks.md]
Prints a markdown section; with --out, replaces the "## supervisor" section there.
"""
import argparse
import datetime
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks_md import write_section  # noqa: E402
import time

N = 8


def config(dir, command, grace="5s"):
    (dir / "cache").mkdir(mode=0o700, exist_ok=True)
    cmd = ", ".join(f'"{c}"' for c in command)
    path = dir / "run.toml"
    path.write_text(f'[run]\nname = "b"\ncache_dir = "cache"\nlog_dir = "runs"\n\n'
                    f'[[role]]\nname = "p"\ncpu = {N}\ncommand = [{cmd}]\nstop = {{ grace = "{grace}" }}\n')
    return path


def ours(args, dir, command, run_id):
    return [str(args.bin / "dflash-launch"), "run", str(config(dir, command)), "--run-id", run_id, "--color", "never"]


def theirs(args, command, extra=()):
    return [str(args.torchrun), "--standalone", "--nproc-per-node", str(N), "--no-python", *extra, *command]


def read_ns(path):
    return int(path.read_text().split()[0])


def startup(args, which, rounds):
    """ms from the launch to the 8th payload's main(), and to the launcher's exit."""
    first, total = [], []
    for i in range(rounds):
        d = pathlib.Path(tempfile.mkdtemp(prefix="bench-sup-"))
        cmd = [str(args.bin / "bench_payload"), "start", str(d), "0"]
        argv = ours(args, d, cmd, f"s{i}") if which == "dflash-launch" else theirs(args, cmd)
        t0 = time.time_ns()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        t_end = time.time_ns()
        starts = [read_ns(d / f"start.{r}") for r in range(N)]
        first.append((max(starts) - t0) / 1e6)
        total.append((t_end - t0) / 1e6)
        shutil.rmtree(d)
    return first, total


def log_time_ns(line):
    """The supervisor log's local timestamp (microseconds) as epoch ns."""
    stamp = line[:26]
    dt = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f")
    return int(dt.timestamp() * 1e9)


def death(args, which, rounds):
    """ms from a payload's exit to the supervisor noticing it, and to the launcher's exit."""
    notice, gone = [], []
    for i in range(rounds):
        d = pathlib.Path(tempfile.mkdtemp(prefix="bench-sup-"))
        cmd = [str(args.bin / "bench_payload"), "die", str(d), "3", "300"]
        argv = ours(args, d, cmd, f"d{i}") if which == "dflash-launch" else theirs(args, cmd)
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_end = time.time_ns()
        died = read_ns(d / "death")
        gone.append((t_end - died) / 1e6)
        if which == "dflash-launch":
            for line in (d / f"runs/d{i}/supervisor.log").read_text().splitlines():
                if "p:3 RUNNING -> EXITED" in line:
                    notice.append((log_time_ns(line) - died) / 1e6)
        shutil.rmtree(d)
    return notice, gone


def logs(args, which, mb):
    """MB/s from the first payload's start until every byte is in its file: for
    dflash-launch, until the launcher has exited (it copies from pipes); for
    torchrun -r 3, until the last payload has written (each writes its file itself)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-sup-", dir=args.tmp))
    (d / "t").mkdir()
    cmd = [str(args.bin / "bench_payload"), "log", str(mb), str(d / "t")]
    if which == "dflash-launch":
        argv = ours(args, d, cmd, "l")
    else:
        argv = theirs(args, cmd, ["--log-dir", str(d / "tr"), "--redirects", "3"])
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    t_end = time.time_ns()
    first = min(read_ns(d / f"t/start.{r}") for r in range(N))
    last = t_end if which == "dflash-launch" else max(read_ns(d / f"t/end.{r}") for r in range(N))
    want = -(-(mb << 20) // 100) * 100  # whole 100-byte lines
    if which == "dflash-launch":
        files = sorted((d / "runs/l/attempt_0").glob("p-*.stdout.log"))
    else:
        files = sorted((d / "tr").rglob("stdout.log"))
    sizes = [f.stat().st_size for f in files]
    lost = N * want - sum(sizes)
    shutil.rmtree(d)
    return N * want / ((last - first) / 1e9) / 1e6, lost, len(files)


def cat_reference(args, mb):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-sup-", dir=args.tmp))
    t0 = time.perf_counter()
    subprocess.run(f"{args.bin}/bench_payload log {mb * N} | cat | cat > {d}/out", shell=True, check=True,
                   executable="/bin/bash")
    took = time.perf_counter() - t0
    shutil.rmtree(d)
    return N * (mb << 20) / took / 1e6


def proc_cpu_rss(pid):
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    rss = hwm = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return ticks / os.sysconf("SC_CLK_TCK"), rss / 1024, hwm / 1024


def idle(args, which, seconds=5.0):
    d = pathlib.Path(tempfile.mkdtemp(prefix="bench-sup-"))
    cmd = [str(args.bin / "bench_payload"), "start", str(d), "600000"]
    argv = ours(args, d, cmd, "i") if which == "dflash-launch" else theirs(args, cmd)
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(list(d.glob("start.*"))) < N:
        time.sleep(0.05)
    time.sleep(1.0)
    cpu0, _, _ = proc_cpu_rss(p.pid)
    time.sleep(seconds)
    cpu1, rss, hwm = proc_cpu_rss(p.pid)
    os.killpg(p.pid, 15)
    p.wait()
    shutil.rmtree(d, ignore_errors=True)
    return (cpu1 - cpu0) / seconds * 100, rss, hwm


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    root = pathlib.Path(__file__).resolve().parents[2]
    ap.add_argument("--bin", type=pathlib.Path, default=root / "build/bin")
    ap.add_argument("--torchrun", type=pathlib.Path, default=root / ".venv/bin/torchrun")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--torchrun-rounds", type=int, default=5)
    ap.add_argument("--log-mb", type=int, default=64)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()

    r = {}
    for which, rounds in (("dflash-launch", args.rounds), ("torchrun", args.torchrun_rounds)):
        print(f"{which}: startup ...", file=sys.stderr)
        r[which, "start"], r[which, "total"] = startup(args, which, rounds)
        print(f"{which}: death ...", file=sys.stderr)
        r[which, "notice"], r[which, "gone"] = death(args, which, rounds)
        print(f"{which}: logs ...", file=sys.stderr)
        r[which, "logs"] = logs(args, which, args.log_mb)
        print(f"{which}: idle ...", file=sys.stderr)
        r[which, "idle"] = idle(args, which)
    cat = cat_reference(args, args.log_mb)

    def ms(v):
        return f"{statistics.median(v):.1f} / {pct(v, 0.9):.1f}"

    ours_start, tr_start = statistics.median(r["dflash-launch", "start"]), statistics.median(r["torchrun", "start"])
    ours_gone, tr_gone = statistics.median(r["dflash-launch", "gone"]), statistics.median(r["torchrun", "gone"])
    lo, tl = r["dflash-launch", "logs"], r["torchrun", "logs"]
    io, ti = r["dflash-launch", "idle"], r["torchrun", "idle"]
    cmd = "python3 bench/supervisor/run_bench.py " + " ".join(sys.argv[1:])
    md = f"""## supervisor

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine, {N} payloads, the same `bench_payload` binary under
both launchers (dflash-launch: `[[role]] cpu = {N}`, every payload behind its `dflash-worker`; torchrun 2.13:
`--standalone --nproc-per-node {N} --no-python`). Medians / p90 over {args.rounds} rounds (torchrun: {args.torchrun_rounds}).

| | dflash-launch | torchrun | ratio | goal |
|---|---|---|---|---|
| (1) launch -> all {N} payloads running, ms | {ms(r["dflash-launch", "start"])} | {ms(r["torchrun", "start"])} | {tr_start / ours_start:.0f}x faster | <= 15 ms, >= 20x |
| (1b) launch -> all {N} exited and the launcher gone, ms | {ms(r["dflash-launch", "total"])} | {ms(r["torchrun", "total"])} | {statistics.median(r["torchrun", "total"]) / statistics.median(r["dflash-launch", "total"]):.0f}x | |
| (2) a payload's death -> the supervisor notices, ms | {ms(r["dflash-launch", "notice"])} | (polls every `--monitor-interval`) | | <= 20 ms |
| (2b) a payload's death -> peers stopped, launcher exited, ms | {ms(r["dflash-launch", "gone"])} | {ms(r["torchrun", "gone"])} | {tr_gone / ours_gone:.0f}x | |
| (3) log throughput, {N} x {args.log_mb} MiB of 100-byte lines into per-process files | {lo[0]:.0f} MB/s, {lo[1]} bytes lost ({lo[2]} files) | {tl[0]:.0f} MB/s, {tl[1]} lost (`-r 3`: the payload writes the file itself, no copy) | {lo[0] / tl[0]:.2f} | >= 200 MB/s, 0 lost |
| (3') for scale: `bench_payload log | cat | cat > file` | {cat:.0f} MB/s | | | |
| (4) supervisor RSS while {N} payloads sleep (peak) | {io[1]:.1f} MB ({io[2]:.1f} MB) | {ti[1]:.1f} MB ({ti[2]:.1f} MB) | {ti[1] / io[1]:.0f}x less | <= 15 MB |
| (4) supervisor CPU while idle | {io[0]:.2f} % | {ti[0]:.2f} % | | ~0 |

Log files are on `{args.tmp}`; console to /dev/null (dflash-launch still splits and prefixes every line for it).
"""
    print(md)
    if args.out:
        write_section(args.out, "## supervisor", md)


if __name__ == "__main__":
    main()

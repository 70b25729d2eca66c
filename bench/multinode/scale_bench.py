"""What N nodes cost the coordination store, and how fast a lost node stops the rest (issue #58).

Two sides, each against one redis-server of its own on this machine, "before" (an earlier commit's coordinator,
bench/multinode/build_before.sh) and "after" (this build) alternating in the same run:

- swarm: N real NodeCoordinators in one process (bench/multinode/coordinator_swarm.cc), N up to 1,000 (1,000
  launchers do not fit here). Start (first registration -> every node past the barrier), a steady window
  (--hold-s) in which Redis's `total_commands_processed` (INFO stats; commands inside scripts count, as
  `INFO commandstats` shows) and redis-server's CPU (/proc/<pid>/stat) are read, then one node killed (its
  coordinator destroyed without "done": the watcher, the harder case) and the time until every other node
  stopped, with the culprit names they gave.
- launchers: N real `dflash-launch run --nnodes N` processes, one trivial payload each (a shell that touches a file
  and sleeps), N up to 128. Start (spawn -> every payload running), the same steady window (plus the launchers'
  CPU), then SIGKILL of one launcher and the time until every other launcher exited, and the culprits their
  summary.json name.

Usage: .venv/bin/python bench/multinode/scale_bench.py [--swarm 16,128,1000] [--launchers 16,64,128]
           [--before /tmp/dflash-swarm-before/coordinator_swarm_bench] [--before-launch /path/dflash-launch]
           [--ttl-ms 5000] [--hold-s 10] [--out docs/benchmarks.md]
"""
import argparse
import os
import pathlib
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks_md import write_section  # noqa: E402
from redis_server import RedisServer, resp  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of one process (its threads included), seconds."""
    try:
        f = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / TICK


def commands(port):
    info = resp(port, "INFO", "stats")
    for line in info.splitlines():
        if line.startswith("total_commands_processed:"):
            return int(line.split(":")[1])
    raise RuntimeError("no total_commands_processed in INFO stats")


def loadavg():
    return pathlib.Path("/proc/loadavg").read_text().split()[0]


class Window:
    """Redis's commands and CPU (and the given processes' CPU) between start() and stop()."""

    def __init__(self, redis, pids=()):
        self.redis, self.pids = redis, list(pids)

    def start(self):
        self.t, self.c, self.rc = time.monotonic(), commands(self.redis.port), cpu_s(self.redis.proc.pid)
        self.pc = sum(cpu_s(p) for p in self.pids)
        self.load0 = loadavg()

    def stop(self):
        dt = time.monotonic() - self.t
        return {"s": dt, "cmds": (commands(self.redis.port) - self.c) / dt,
                "redis_cpu": (cpu_s(self.redis.proc.pid) - self.rc) / dt,
                "proc_cpu": (sum(cpu_s(p) for p in self.pids) - self.pc) / dt, "load": f"{self.load0}-{loadavg()}"}


def run_swarm(binary, n, ttl_ms, hold, work, tag):
    redis = RedisServer(work / f"redis-swarm-{tag}-{n}").start()
    try:
        p = subprocess.Popen([str(binary), "--store", redis.url, "--nodes", str(n), "--ttl-ms", str(ttl_ms),
                              "--hold-s", str(hold), "--kill", "watcher" if tag == "after" else "other",
                              "--run-id", f"sw{n}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        res = {"n": n, "tag": tag, "culprits": {}}
        win = Window(redis, [p.pid])
        for line in p.stdout:
            word, *rest = line.split()
            if word == "started":
                res["start"] = float(rest[0])
            elif word == "hold":
                win.start()
            elif word == "held":
                res.update(win.stop())
            elif word == "cpu":
                res["swarm_cpu"] = float(rest[0]) / hold
            elif word == "killed":
                res["victim"] = f"node {rest[0]} ({rest[1]})"
            elif word == "stopped":
                res["stopped"], res["det_max"], res["det_med"] = int(rest[0]), float(rest[1]), float(rest[2])
            elif word == "culprit":
                name, count = line.split(None, 1)[1].rsplit("|", 1)
                res["culprits"][name] = int(count)
        err = p.stderr.read()
        p.wait()
        res["rc"] = p.returncode
        if p.returncode != 0:
            res["err"] = err[-500:]
        return res
    finally:
        redis.kill()


PAYLOAD = 'touch {out}/$DFLASH_NODE_RANK.up; exec sleep 1000'


def run_pids(run_id):
    """Live processes whose environment says DFLASH_RUN_ID=run_id."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"DFLASH_RUN_ID={run_id}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def run_launchers(binary, n, ttl_ms, hold, work, tag):
    redis = RedisServer(work / f"redis-launch-{tag}-{n}").start()
    out = work / f"out-{tag}-{n}"
    out.mkdir()
    config = work / f"run-{tag}-{n}.toml"
    config.write_text(textwrap.dedent(f"""\
        [run]
        name = "scale"
        cache_dir = "{work}/cache"
        log_dir = "{work}/runs-{tag}-{n}"
        store = "{redis.url}"
        store_ttl = "{ttl_ms}ms"
        store_barrier_timeout = "10m"

        [[role]]
        name = "w"
        cpu = 1
        command = ["sh", "-c", "{PAYLOAD.format(out=out)}"]
        stop = {{ signal = "SIGKILL" }}
        """))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    res = {"n": n, "tag": tag, "culprits": {}}
    run_id = f"sc{n}-{tag}-{os.getpid()}"
    try:
        t0 = time.monotonic()
        for r in range(n):
            procs.append(subprocess.Popen(
                [str(binary), "run", str(config), "--run-id", run_id, "--nnodes", str(n), "--node-rank", str(r),
                 "--master-addr", "127.0.0.1", "--color", "never"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True))
        while len(list(out.glob("*.up"))) < n:
            if time.monotonic() - t0 > 600 or any(p.poll() is not None for p in procs):
                res["err"] = f"{len(list(out.glob('*.up')))} of {n} payloads up; exited: " + \
                             str([p.returncode for p in procs if p.poll() is not None][:5])
                return res
            time.sleep(0.02)
        res["start"] = time.monotonic() - t0
        time.sleep(ttl_ms / 1000)
        win = Window(redis, [p.pid for p in procs])
        win.start()
        time.sleep(hold)
        res.update(win.stop())
        victim = n // 2
        k0 = time.monotonic()
        os.kill(procs[victim].pid, signal.SIGKILL)
        res["victim"] = f"node {victim}"
        others = [p for i, p in enumerate(procs) if i != victim]
        done = {}
        while len(done) < len(others) and time.monotonic() - k0 < ttl_ms / 1000 + 120:
            for p in others:
                if p.pid not in done and p.poll() is not None:
                    done[p.pid] = time.monotonic() - k0
            time.sleep(0.01)
        times = sorted(done.values())
        res["stopped"] = len(times)
        res["det_max"] = times[-1] if times else -1
        res["det_med"] = times[len(times) // 2] if times else -1
        import json
        for r in range(n):
            if r == victim:
                continue
            try:
                s = json.loads((work / f"runs-{tag}-{n}/{run_id}/node_{r}/summary.json").read_text())
            except (OSError, ValueError):
                continue
            res["culprits"][s.get("culprit")] = res["culprits"].get(s.get("culprit"), 0) + 1
        return res
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for pid in run_pids(run_id):  # payloads that outlived a launcher (by pid: this run's env only)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        redis.kill()


def fmt_row(r, ttl_s):
    if "err" in r and "cmds" not in r:
        return f"| {r['n']} | {r['tag']} | failed: {r['err'][:120]} | | | | | | |"
    cul = "; ".join(f"\"{k}\" x{v}" for k, v in sorted(r["culprits"].items(), key=lambda kv: -kv[1]))
    cpu = r.get("swarm_cpu", r.get("proc_cpu", 0))
    return (f"| {r['n']} | {r['tag']} | {r.get('start', float('nan')):.2f} s | {r['cmds']:,.0f} | "
            f"{r['cmds'] / r['n']:,.1f} | {100 * r['redis_cpu']:.1f} % | {100 * cpu:.1f} % | "
            f"{r.get('det_max', -1) - ttl_s:+.2f} s (median {r.get('det_med', -1) - ttl_s:+.2f} s, "
            f"{r.get('stopped', 0)} of {r['n'] - 1}, killed {r.get('victim', '?')}) | {cul} | {r['load']} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swarm", default="16,128,1000")
    ap.add_argument("--launchers", default="")
    ap.add_argument("--swarm-bin", type=pathlib.Path, default=ROOT / "build/bin/coordinator_swarm_bench")
    ap.add_argument("--launch-bin", type=pathlib.Path, default=ROOT / "build/bin/dflash-launch")
    ap.add_argument("--before", type=pathlib.Path, help="an earlier coordinator's swarm (build_before.sh)")
    ap.add_argument("--before-launch", type=pathlib.Path, help="an earlier build's dflash-launch")
    ap.add_argument("--ttl-ms", type=int, default=5000)
    ap.add_argument("--hold-s", type=float, default=10.0)
    ap.add_argument("--out", type=pathlib.Path)
    a = ap.parse_args()
    lim = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim[1], lim[1]))  # redis-server inherits it: its maxclients
    work = pathlib.Path(tempfile.mkdtemp(prefix="dflash-scale-"))
    rows = []
    ttl_s = a.ttl_ms / 1000
    try:
        for n in [int(x) for x in a.swarm.split(",") if x]:
            for tag, binary in (("before", a.before), ("after", a.swarm_bin)):
                if binary is None or (tag == "before" and n > 256):
                    continue  # before: the store saturates near N = 250 (the measurement)
                r = run_swarm(binary, n, a.ttl_ms, a.hold_s, work, tag)
                print(r, flush=True)
                rows.append(("swarm", r))
        for n in [int(x) for x in a.launchers.split(",") if x]:
            for tag, binary in (("before", a.before_launch), ("after", a.launch_bin)):
                if binary is None:
                    continue
                r = run_launchers(binary, n, a.ttl_ms, a.hold_s, work, tag)
                print(r, flush=True)
                rows.append(("launchers", r))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = ("| N | code | start | store commands/s | per node | Redis CPU (one core) | {who} CPU | "
            "kill -> every other node stopped, past the ttl (worst) | culprits named | load (1 min) |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    parts = []
    for side, who in (("swarm", "the swarm process"), ("launchers", "launchers (all)")):
        sel = [r for s, r in rows if s == side]
        if sel:
            parts.append(f"**{side}**\n\n" + head.format(who=who) + "\n" + "\n".join(fmt_row(r, ttl_s) for r in sel))
    table = "\n\n".join(parts)
    print(table)
    if a.out:
        cmd = " ".join(["bench/multinode/scale_bench.py"] + sys.argv[1:])
        # The full before/after run keeps its section (and its reading, written by hand); a swarm-only run
        # (`make bench`) writes one of its own.
        heading = ("## multinode scale: N nodes on one store (issue #58)" if a.launchers or a.before
                   else f"## multinode scale: {a.swarm} coordinators in one process (make bench)")
        write_section(a.out, heading,
                      f"{heading}\n\n`.venv/bin/python {cmd}` — "
                      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, store_ttl {a.ttl_ms} ms, steady window "
                      f"{a.hold_s:g} s, one redis-server 7.0 per row, this 2-core machine shared with other work "
                      f"(load in the last column).\n\n{table}\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Live control of a run of 5 targets + 3 drafters (tests/payloads/ctl_step.py), against supervisord
(`supervisorctl`) on the same payloads, in the same run of this script:

  (1) `status` round trip: the CLI (`dflash-launch ctl RUN status --json` / `supervisorctl status`), and
      one request on the control socket from a connected client
  (2) restart the 3 drafters while the 5 targets run: from the request to all 3 RUNNING again
      (ours: RUNNING = the new payload sent READY=1; supervisord: startsecs=0, RUNNING = spawned)
  (3) the live view's idle CPU: the supervisor under a pty (script(1)) with 8 idle payloads, vs --plain

Usage: python3 bench/ctl/run_bench.py [--bin build/bin] [--rounds 20] [--out docs/benchmarks.md]
Needs `pip install supervisor` (python/requirements-dev.txt).
"""
import argparse
import datetime
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from benchmarks_md import write_section  # noqa: E402

PAYLOAD = ROOT / "tests" / "payloads" / "ctl_step.py"


def config(d, step_s):
    d.mkdir(parents=True, exist_ok=True)
    (d / "cache").mkdir(mode=0o700, exist_ok=True)
    cmd = json.dumps([sys.executable, str(PAYLOAD)])
    roles = ""
    for name, devs in (("target", "[0, 1, 2, 3, 4]"), ("drafter", "[5, 6, 7]")):
        roles += (f'\n[[role]]\nname = "{name}"\ndevices = {devs}\ncommand = {cmd}\nready = "notify"\n'
                  f'env = {{ STEP_S = "{step_s}" }}\nstop = {{ grace = "5s" }}\n')
    p = d / "run.toml"
    p.write_text('[run]\nname = "b"\ncache_dir = "cache"\nlog_dir = "runs"\n' + roles)
    return p


def ms(xs):
    xs = sorted(xs)
    return f"{statistics.median(xs) * 1000:.1f} / {xs[int(0.9 * (len(xs) - 1))] * 1000:.1f}"


class Ours:
    def __init__(self, args, d, step_s="0.5", pty=False, plain=False):
        self.bin = args.bin / "dflash-launch"
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(d / "xdg"), TERM="xterm")
        (d / "xdg").mkdir(mode=0o700, parents=True)
        cmd = [str(self.bin), "run", str(config(d, step_s)), "--run-id", "b"] + (["--plain"] if plain else [])
        if pty:
            cmd = ["script", "-qfec", "stty rows 50 cols 120; exec " + " ".join(cmd), "/dev/null"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=self.env, start_new_session=True)
        self.run_dir = d / "runs" / "b"
        self.wait(lambda s: len(s) == 8 and all(p["state"] == "RUNNING" for p in s.values()), 120)
        self.pid = json.loads(self.ctl("ps", "--json", ctl=False).stdout)[0]["pid"]

    def ctl(self, *a, ctl=True):
        return subprocess.run([str(self.bin), *(["ctl", "b"] if ctl else []), *a], env=self.env,
                              capture_output=True, text=True)

    def ask(self, request):
        """One request on a fresh connection (the socket directly: what the CLI costs without its exec)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.run_dir / "control.sock"))
            s.sendall((json.dumps(request) + "\n").encode())
            buf = b""
            while not buf.endswith(b"\n"):
                buf += s.recv(1 << 20)
        return json.loads(buf)

    def status(self):
        try:
            return {p["name"]: p for p in self.ask({"verb": "status"})["body"]["processes"]}
        except (OSError, ValueError, KeyError):
            return {}

    def wait(self, pred, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.run_dir / "control.sock").exists() and pred(self.status()):
                return
            time.sleep(0.002)
        raise SystemExit("timed out waiting for the run")

    def stop(self):
        os.killpg(self.proc.pid, 15)
        self.proc.wait(timeout=60)


def cpu_ns(pid):
    """CPU time of every thread of `pid` (the loop and the console's writer), in ns: schedstat is
    exact where /proc/<pid>/stat counts 10 ms ticks."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
    return total


def idle_cpu(pid, seconds):
    t0, c0 = time.monotonic(), cpu_ns(pid)
    time.sleep(seconds)
    return 100.0 * (cpu_ns(pid) - c0) / 1e9 / (time.monotonic() - t0)


def supervisord_conf(d):
    conf = d / "supervisord.conf"
    progs = ""
    for name, n in (("target", 5), ("drafter", 3)):
        progs += (f"[program:{name}]\ncommand={sys.executable} {PAYLOAD}\nnumprocs={n}\n"
                  f"process_name=%(program_name)s_%(process_num)d\nstartsecs=0\nstopsignal=TERM\n"
                  f'environment=STEP_S="0.5"\nstdout_logfile={d}/%(program_name)s_%(process_num)d.log\n'
                  f"redirect_stderr=true\n\n")
    conf.write_text(f"""[unix_http_server]
file={d}/supervisor.sock
chmod=0700

[supervisord]
logfile={d}/supervisord.log
pidfile={d}/supervisord.pid
nodaemon=true

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{d}/supervisor.sock

""" + progs)
    return conf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, default=ROOT / "build" / "bin")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--restarts", type=int, default=5)
    ap.add_argument("--idle-s", type=float, default=10)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    args.bin = args.bin.resolve()
    venv_bin = pathlib.Path(sys.executable).parent
    sd, sctl = venv_bin / "supervisord", venv_bin / "supervisorctl"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ctl_bench_"))
    rows = {}
    try:
        # --- ours
        o = Ours(args, tmp / "ours")
        cli, sock = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            r = o.ctl("status", "--json")
            cli.append(time.perf_counter() - t)
            assert r.returncode == 0, r.stderr
            t = time.perf_counter()
            assert o.ask({"verb": "status"})["ok"]
            sock.append(time.perf_counter() - t)
        restart = []
        for _ in range(args.restarts):
            old = {n: p["pid"] for n, p in o.status().items() if n.startswith("drafter")}
            targets = {n: p["pid"] for n, p in o.status().items() if n.startswith("target")}
            t = time.perf_counter()
            r = o.ctl("restart", "drafter")
            assert r.returncode == 0, r.stderr
            o.wait(lambda s: all(s.get(n, {}).get("state") == "RUNNING" and s[n]["pid"] not in (-1, old[n])
                                 for n in old))
            restart.append(time.perf_counter() - t)
            assert {n: p["pid"] for n, p in o.status().items() if n.startswith("target")} == targets
        o.stop()
        rows["cli"] = ms(cli)
        rows["sock"] = ms(sock)
        rows["restart"] = ms(restart)
        # --- supervisord, same payloads, same machine, right after
        sdir = tmp / "sd"
        sdir.mkdir()
        conf = supervisord_conf(sdir)
        sup = subprocess.Popen([str(sd), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ctl = lambda *a: subprocess.run([str(sctl), "-c", str(conf), *a], capture_output=True, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ctl("status").stdout.count("RUNNING") != 8:
            time.sleep(0.05)
        s_cli, s_restart = [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            ctl("status")
            s_cli.append(time.perf_counter() - t)
        for _ in range(args.restarts):
            t = time.perf_counter()
            r = ctl("restart", "drafter:*")  # returns once the group is started again
            s_restart.append(time.perf_counter() - t)
            assert r.stdout.count("started") == 3, r.stdout
        assert ctl("status").stdout.count("RUNNING") == 8
        ctl("shutdown")
        sup.wait(timeout=60)
        rows["s_cli"] = ms(s_cli)
        rows["s_restart"] = ms(s_restart)
        # --- the live view, idle: payloads that sleep (one line each, then nothing)
        for mode in ("live", "plain"):
            v = Ours(args, tmp / f"view_{mode}", step_s="3600", pty=True, plain=mode == "plain")
            rows[mode] = idle_cpu(v.pid, args.idle_s)
            v.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ratio = lambda a, b: f"{float(b.split()[0]) / float(a.split()[0]):.1f}x"
    cmd = "python3 bench/ctl/run_bench.py " + " ".join(sys.argv[1:])
    md = f"""## live control (ctl)

`{cmd}` — {datetime.date.today()}, this 2-core machine (shared with other work), 5 targets + 3 drafters of
`tests/payloads/ctl_step.py` (Python, a step every 0.5 s) under `dflash-launch` and under supervisord
{_version()} (`numprocs`, `startsecs=0`), one after the other in the same run. Medians / p90 over {args.rounds}
status rounds and {args.restarts} restarts.

| | dflash-launch | supervisord | ratio |
|---|---|---|---|
| (1) `status` round trip, CLI (`ctl b status --json` / `supervisorctl status`), ms | {rows['cli']} | {rows['s_cli']} | {ratio(rows['cli'], rows['s_cli'])} faster |
| (1b) `status` on the socket, one request from a client (no exec), ms | {rows['sock']} | | |
| (2) restart the 3 drafters -> all 3 RUNNING again, targets untouched, ms | {rows['restart']} | {rows['s_restart']} | {ratio(rows['restart'], rows['s_restart'])} |
| (3) supervisor CPU (all its threads), live view on a pty, 8 idle payloads, {args.idle_s:.0f} s | {rows['live']:.3f} % | | goal <= 1 % |
| (3b) the same with `--plain` | {rows['plain']:.3f} % | | |

(2): ours is `ctl restart drafter` until the status shows 3 new pids RUNNING, and RUNNING means the new payload
sent `READY=1` (a Python start); supervisord's `restart drafter:*` returns when the group is RUNNING, which with
`startsecs=0` means spawned (with its default `startsecs=1` it is at least 1 s). Both stop with SIGTERM, and the
payload exits at once. Both columns include their CLI's start (`supervisorctl` is Python: ~190 ms of (1) is its
import; `dflash-launch ctl` is a C++ binary). (3): the view redraws once a second (uptime, CPU), so (3) - (3b)
is its cost.
"""
    print(md)
    if args.out:
        write_section(args.out, "## live control (ctl)", md)


def _version():
    try:
        import supervisor.options
        return supervisor.options.VERSION
    except Exception:
        return "?"


if __name__ == "__main__":
    main()

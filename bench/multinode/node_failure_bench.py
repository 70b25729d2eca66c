"""How long a node failure takes to stop the other node: SIGKILL of node 1's launcher -> node 0's launcher exits.

dflash-launch with the Redis store (`--nnodes 2`, a private redis-server per repetition, store_ttl as given) next
to torchrun `--nnodes 2 --rdzv-backend c10d` (agent 0 hosts the rendezvous store), both on this host (loopback),
with the same payload: 2 processes per node in one gloo world of 4, an all_reduce every 50 ms for at most
--payload-s seconds. Each repetition: start both nodes, wait until all 4 ranks have done an all_reduce, SIGKILL
node 1's launcher/agent, time until node 0's exits (or --payload-s + 30 s: "did not stop").

Usage: .venv/bin/python bench/multinode/node_failure_bench.py [--reps 3] [--ttl 5s] [--out docs/benchmarks.md]
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
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
from redis_server import RedisServer  # noqa: E402
from supervise import write_config  # noqa: E402

# Without collectives: nothing but the store can tell node 0 that node 1 is gone.
QUIET = textwrap.dedent("""\
    import os, pathlib, sys, time
    out, limit = pathlib.Path(sys.argv[1]), float(sys.argv[2])
    (out / f"{os.environ['RANK']}.up").touch()
    time.sleep(limit)
    """)

PAYLOAD = textwrap.dedent("""\
    import datetime, os, pathlib, sys, time
    import torch, torch.distributed as dist
    out, limit = pathlib.Path(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    (out / f"{os.environ['RANK']}.up").touch()
    end = time.monotonic() + limit
    while time.monotonic() < end:
        dist.all_reduce(t)
        time.sleep(0.05)
    """)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def payload_procs(out, group_rank=None):
    """Live payload processes of this repetition (their command line names its `out` dir), of one node if given
    (GROUP_RANK: both launchers set it). torchrun starts its workers in sessions of their own, so a session or
    process-group scan would miss them."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if str(out).encode() not in (d / "cmdline").read_bytes():
                continue
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if group_rank is None or f"GROUP_RANK={group_rank}".encode() in env:
            found.append(int(d.name))
    return found


def one_rep(nodes, out, limit, log0=None):
    """nodes: two Popens already started. Returns (seconds from SIGKILL of node 1 to node 0's exit, or None;
    node 0's exit code; how many of node 1's processes were still alive 1 s after the kill)."""
    try:
        if not wait_for(lambda: len(list(out.glob("*.up"))) >= 4 or any(p.poll() is not None for p in nodes), 120):
            raise RuntimeError("the payload did not come up")
        if any(p.poll() is not None for p in nodes):
            raise RuntimeError(f"a node ended before the kill: {[p.poll() for p in nodes]}")
        t0 = time.monotonic()
        os.kill(nodes[1].pid, signal.SIGKILL)
        left = None
        try:
            nodes[0].wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        left = len(payload_procs(out, 1))
        # torchrun's agent may report the failure (ChildFailedError in its log) long before its process exits.
        reported = None
        deadline = t0 + limit + 30
        while time.monotonic() < deadline and nodes[0].poll() is None:
            if reported is None and log0 is not None and "ChildFailedError" in log0.read_text(errors="replace"):
                reported = time.monotonic() - t0
            time.sleep(0.02)
        if nodes[0].poll() is None:
            return None, None, left, reported
        return time.monotonic() - t0, nodes[0].returncode, left, reported
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for pid in payload_procs(out):  # workers in sessions of their own (torchrun's)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_dflash(bin_dir, py, work, rep, ttl, limit, script_name="payload.py"):
    out = work / f"d{rep}{script_name}"
    out.mkdir()
    redis = RedisServer(work / f"redis{rep}{script_name}").start()
    script = work / script_name
    config = write_config(work, f"""\
        store = "{redis.url}"
        store_ttl = "{ttl}"

        [[role]]
        name = "w"
        cpu = 2
        command = {json.dumps([str(py), str(script), str(out), str(limit)])}
        """, name="bench")
    nodes = [subprocess.Popen([str(bin_dir / "dflash-launch"), "run", str(config), "--run-id", f"b{rep}{out.name}",
                               "--nnodes", "2", "--node-rank", str(r), "--color", "never"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for r in (0, 1)]
    try:
        return one_rep(nodes, out, limit)
    finally:
        redis.kill()


def run_torchrun(py, work, rep, limit):
    out = work / f"t{rep}"
    out.mkdir()
    port = free_port()
    script = work / "payload.py"
    torchrun = pathlib.Path(py).parent / "torchrun"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    nodes = []
    for host in ("true", "false"):  # agent "0" hosts the c10d store, the one we kill does not
        nodes.append(subprocess.Popen(
            [str(torchrun), "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bench{rep}", "--rdzv-conf", f"is_host={host}",
             "--max-restarts", "0", "--monitor-interval", "0.1", str(script), str(out), str(limit)],
            stdout=subprocess.DEVNULL, stderr=open(work / f"torchrun{rep}-{host}.log", "w"), env=env,
            start_new_session=True))
    return one_rep(nodes, out, limit, work / f"torchrun{rep}-true.log")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=pathlib.Path, default=ROOT / "build" / "bin")
    ap.add_argument("--python", type=pathlib.Path, default=ROOT / ".venv" / "bin" / "python")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ttl", default="5s")
    ap.add_argument("--payload-s", type=float, default=40.0)
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--verbose", action="store_true", help="print the torchrun agents' log tails")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="dflash-nodebench-"))
    (work / "payload.py").write_text(PAYLOAD)
    (work / "quiet.py").write_text(QUIET)
    ours, theirs, quiet = [], [], []
    try:
        for rep in range(a.reps):
            ours.append(run_dflash(a.bin, a.python, work, rep, a.ttl, a.payload_s))
            theirs.append(run_torchrun(a.python, work, rep, a.payload_s))
            quiet.append(run_dflash(a.bin, a.python, work, rep, a.ttl, a.payload_s, "quiet.py"))
            print(f"rep {rep}: dflash-launch {ours[-1]}, torchrun c10d {theirs[-1]}, dflash-launch quiet {quiet[-1]}",
                  flush=True)
    finally:
        logs = {p.name: p.read_text()[-2000:] for p in work.glob("torchrun*.log")}
        shutil.rmtree(work, ignore_errors=True)

    def fmt(results):
        secs = [s for s, _, _, _ in results if s is not None]
        med = statistics.median(secs) if secs else None
        return med, "; ".join(("did not exit" if s is None else f"{s:.2f} s (exit {rc})") +
                              ("" if rep is None else f", failure reported at {rep:.2f} s") +
                              f", {left} of node 1's processes alive 1 s after the kill"
                              for s, rc, left, rep in results)

    our_med, our_all = fmt(ours)
    their_med, their_all = fmt(theirs)
    quiet_med, quiet_all = fmt(quiet)
    if our_med and their_med:
        ratio = f"{their_med / our_med:.1f}x"
    elif our_med and all(r[0] is None for r in theirs):
        ratio = f"> {(a.payload_s + 30) / our_med:.0f}x (torchrun never exited in the window)"
    else:
        ratio = "n/a"
    print(f"dflash-launch median {our_med}, torchrun median {their_med}, ratio {ratio}")
    md = f"""## node failure: SIGKILL of one node's launcher

`.venv/bin/python bench/multinode/node_failure_bench.py --reps {a.reps} --ttl {a.ttl} --payload-s {a.payload_s:g} --out docs/benchmarks.md`
— {time.strftime('%Y-%m-%d')}, this 2-core machine (shared with other work), two "nodes" on loopback, 2 processes each in
one gloo world of 4 (an `all_reduce` every 50 ms). SIGKILL node 1's `dflash-launch` (store mode, `store_ttl =
"{a.ttl}"`, a redis-server of its own) or node 1's torchrun agent (`--rdzv-backend c10d`, agent 0 hosting the
rendezvous store, `--max-restarts 0`), then time until node 0's launcher / agent exits. Alternating, same run.

| | dflash-launch + Redis store | torchrun c10d | ratio |
|---|---|---|---|
| SIGKILL node 1 -> node 0 exits, median of {a.reps} | {f"{our_med:.2f} s" if our_med else "n/a"} | {f"{their_med:.2f} s" if their_med else "n/a"} | {ratio} |
| every repetition | {our_all} | {their_all} | |
| the same, payload without collectives (only the store can tell), median | {f"{quiet_med:.2f} s" if quiet_med else "n/a"} ({quiet_all}) | not run (its agent acts on its own workers' exits) | |

Why: node 1's processes die with its launcher (`PR_SET_PDEATHSIG`, the guardian), so node 0's next `all_reduce`
fails at once and node 0 stops on that failure (exit = its culprit's code, here 1); without collectives (third row)
only the store can tell, and does within `store_ttl` + 0.2 s (exit 70, culprit "node 1 (launcher lost)";
tests/test_multinode_store.py checks the same with store_ttl 1 s). torchrun: "did not exit" = agent 0 was still
running {a.payload_s + 30:g} s after the kill. Node 1's workers outlive their SIGKILLed agent (torchrun starts them
in sessions of their own; "N of node 1's processes alive" above) and go on training with node 0's as orphans; when
the payload ends, agent 0 waits in its exit barrier for the dead agent (torchrun's default `exit_barrier_timeout`
is 300 s). A scheduler that kills the whole node hides this; a lone agent crash does not.
"""
    if a.out:
        write_section(a.out, "## node failure: SIGKILL of one node's launcher", md)
    if a.verbose:
        for name, text in logs.items():
            print(f"--- {name} (tail)\n{text}")


if __name__ == "__main__":
    main()

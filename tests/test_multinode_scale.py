"""64 node launchers of one run on this host, one Redis store (issue #58; docs/multinode.md, "One watcher"): they
all start, and when the watcher's own launcher is SIGKILLed, every other node stops (exit 70) naming it one way,
"node k (launcher lost)", in its summary. A long variant (`make test-long`): 64 launchers on 2 cores take a while;
bench/multinode/scale_bench.py measures the same at 16 to 1,000 nodes."""
import json
import os
import signal
import time

import pytest

from supervise import wait_until, write_config
from test_multinode_store import redis_cmd, survivors
from test_nodes import start

N = 64


@pytest.mark.long
def test_64_nodes_start_and_the_watchers_loss_stops_every_other_naming_it_once(bin_dir, tmp_path, redis_server):
    out = tmp_path / "out"
    out.mkdir()
    config = write_config(tmp_path, f"""\
        store = "{redis_server.url}"
        store_ttl = "3s"
        store_barrier_timeout = "5m"

        [[role]]
        name = "w"
        cpu = 1
        command = ["sh", "-c", "touch {out}/$DFLASH_NODE_RANK.up; exec sleep 1000"]
        stop = {{ signal = "SIGKILL" }}
        """)
    rid = f"scale64-{os.getpid()}"
    nodes = [start(bin_dir, config, rid, "--nnodes", str(N), "--node-rank", str(r), "--master-addr", "127.0.0.1")
             for r in range(N)]
    try:
        t0 = time.monotonic()
        assert wait_until(lambda: len(list(out.glob("*.up"))) == N or any(p.poll() is not None for p in nodes),
                          timeout=300), f"{len(list(out.glob('*.up')))} of {N} payloads up"
        assert all(p.poll() is None for p in nodes), [p.returncode for p in nodes if p.poll() is not None][:5]
        print(f"{N} nodes started in {time.monotonic() - t0:.1f} s")
        # The watcher holds the session's lease "<rank>:<nonce>" (node 0's nonce is the session).
        session = redis_cmd(redis_server.port, "HGET", f"dflash:{rid}:node:0", "nonce")
        holder = []
        assert wait_until(lambda: holder.append(redis_cmd(redis_server.port, "GET",
                                                          f"dflash:{rid}:{session}:watcher")) or holder[-1],
                          timeout=30), "no node took the watch"
        victim = int(holder[-1].split(":")[0])
        t0 = time.monotonic()
        os.kill(nodes[victim].pid, signal.SIGKILL)
        codes = {}
        for r, p in enumerate(nodes):
            if r != victim:
                codes[r] = p.wait(timeout=180)
        print(f"every other node stopped {time.monotonic() - t0:.1f} s after the kill (store_ttl 3 s)")
    finally:
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert set(codes.values()) == {70}, codes
    culprits = {r: json.loads((tmp_path / f"runs/{rid}/node_{r}/summary.json").read_text())["culprit"]
                for r in codes}
    assert set(culprits.values()) == {f"node {victim} (launcher lost)"}, culprits
    assert wait_until(lambda: not survivors(rid), timeout=60), survivors(rid)

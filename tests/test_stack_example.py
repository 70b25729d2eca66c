"""examples/stack/run.toml end to end (issue 24 item 6, docs/stacks.md): a redis-server service on a named
port, two HTTP target servers over a tiny random Qwen3 (services after the store, ready when /health
answers on their own named port), and a gated DDP world of two drafters after them. Each target server
SIGKILLs itself once mid-run: it is restarted, probed again, and the drafters finish; then the servers and
the store are stopped in reverse order and the run exits 0 with one compile (the warm-up) and two reuses."""
import json
import os
import sys

import pytest

from conftest import ROOT

EXAMPLE = ROOT / "examples" / "stack"


def events(r):
    return [json.loads(line) for line in (r.run_dir / "events.jsonl").read_text().splitlines()]


def first(evs, process, to, after=-1):
    for k, e in enumerate(evs):
        if k > after and e["process"] == process and e["to"] == to:
            return k
    raise AssertionError(f"no event of {process} -> {to} after {after}")


def stack_config(tmp_path):
    """The example as shipped, with this venv's python, the run's dirs in tmp_path, a store password, and
    targets that crash once after serving 3 samples."""
    text = (EXAMPLE / "run.toml").read_text()
    text = text.replace('["python", ', f'["{sys.executable}", ')
    text = text.replace('cwd = "."', f'cwd = "{EXAMPLE}"')
    text = text.replace("/tmp/dflash-stack", str(tmp_path))
    password = tmp_path / "store.password"
    password.write_text("s3cret-for-the-store\n")
    os.chmod(password, 0o600)
    shared = f'STACK_PASSWORD_FILE = "{password}"'
    text = text.replace('env = { STACK_STEPS = "8", STACK_RETRY_S = "120" }',
                        f'env = {{ STACK_STEPS = "8", STACK_RETRY_S = "120", {shared} }}')
    text = text.replace('name = "store"\n', f'name = "store"\nenv = {{ {shared} }}\n')
    text = text.replace('name = "target"\n', f'name = "target"\nenv = {{ {shared}, STACK_FAIL_AFTER = "3", '
                                             f'STACK_STATE_DIR = "{tmp_path}" }}\n')
    (tmp_path / "cache").mkdir(mode=0o700, exist_ok=True)
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.long
def test_the_stack_example_survives_its_target_servers_crashing(launch, tmp_path):
    r = launch(stack_config(tmp_path))
    assert r.wait(timeout=600) == 0, r.err[-4000:]
    s = r.summary()
    assert "services were stopped" in s["reason"], s["reason"]
    procs = {p["name"]: p for p in s["processes"]}
    # Each server crashed once (its marker says after how many samples), was restarted, and answered again.
    for t in ("target:0", "target:1"):
        attempts = procs[t]["attempts"]
        assert (tmp_path / f"{t}.crashed").exists(), procs[t]
        assert [a["outcome"] for a in attempts] == ["restarted", "stopped"], attempts
        assert attempts[0]["exit_code"] == 128 + 9, attempts[0]
    assert procs["store:0"]["attempts"][-1]["outcome"] == "stopped"
    for d in ("drafter:0", "drafter:1"):
        assert procs[d]["attempts"][-1]["outcome"] == "succeeded", procs[d]
        assert procs[d]["gate"]["role"] == "reuse", procs[d]["gate"]
    assert [w["gate"]["role"] for w in s["warmups"]] == ["lead"], s["warmups"]
    # Each process probed its own port: the restarted servers were judged ready by an HTTP 200 on theirs.
    ports = {t: procs[t]["ports"]["http"] for t in ("target:0", "target:1")}
    assert ports["target:0"] != ports["target:1"]
    evs = events(r)
    for t, port in ports.items():
        running = [e for e in evs if e["process"] == t and e["to"] == "RUNNING"]
        assert len(running) == 2, running
        assert all(f"GET http://127.0.0.1:{port}/health" in e["reason"] and "HTTP 200" in e["reason"]
                   for e in running), running
    # The order: store, then the servers, then the drafters' warm-up; a stop in reverse.
    store_up = first(evs, "store:0", "RUNNING")
    assert store_up < first(evs, "target:0", "STARTING") and store_up < first(evs, "target:1", "STARTING")
    servers_up = max(first(evs, "target:0", "RUNNING"), first(evs, "target:1", "RUNNING"))
    assert servers_up < first(evs, "drafter:warmup", "STARTING")
    drafters_done = max(first(evs, "drafter:0", "EXITED"), first(evs, "drafter:1", "EXITED"))
    servers_stop = [first(evs, t, "STOPPING", after=drafters_done) for t in ports]
    assert drafters_done < min(servers_stop)
    assert max(first(evs, t, "EXITED", after=drafters_done) for t in ports) < first(evs, "store:0", "STOPPING")
    # The drafters trained on what the servers computed, through the password-protected store.
    metrics = {d: procs[d]["metrics"] for d in ("drafter:0", "drafter:1")}
    assert all(m["steps"] == 8 for m in metrics.values()), metrics
    served = sum(sum(m["servers"].values()) for m in metrics.values())
    assert served == 16, metrics

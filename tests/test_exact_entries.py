"""What is shared is exact (issue #37): a process runs a loaded precompile entry only where it computes what the
process's own compile would. Real torch.compile, real worlds (gloo, or torch's fake group where the processes take
the gate one by one), real launcher runs; every assertion compares VALUES (compiled against eager, bitwise), and the
cache counters only say who compiled what.

The matrix: compiled functions that read the process's rank and world size (constant folds, a ProcessGroup's
methods), its environment (os.environ, os.getenv), a config module's attribute, a function picked by rank and a
rank-dependent slice, plus one that reads nothing of it (tests/payloads/identity_step.py) x the gate's warm-up mode,
serial mode and the cluster gate x precompile on and off. And DDP and FSDP2 on 3 ranks: 5 steps' losses and grad norms
bitwise equal between a gated run and a run where every rank compiles into a cache of its own. Before the fix, every
identity-reading function in every follower returned the leader's numbers (exit 0)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from supervise import write_config
from test_cluster_gate import node_configs, run_id, start_node, store_env

pytest.importorskip("torch")

VENV_BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
PY = sys.executable
PAYLOADS = ROOT / "tests" / "payloads"

# What each function reads of its process: it may load the leader's entry only where these are the leader's.
READS = {
    "rank_free": lambda rank, world: (),
    "world_and_rank": lambda rank, world: (rank, world),
    "group_methods": lambda rank, world: (rank, world),
    "environ": lambda rank, world: (rank,),
    "getenv": lambda rank, world: (rank,),
    "module_attribute": lambda rank, world: (rank,),
    "picked": lambda rank, world: (rank % 2,),
    "rank_slice": lambda rank, world: (rank % 4,),
}


def identity_role(n, mode, precompile, world):
    return f"""
[[role]]
name = "ranks"
cpu = {n}
command = ["{PY}", "{PAYLOADS / 'identity_step.py'}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", OMP_NUM_THREADS = "1", IDENTITY_WORLD = "{world}" }}
gate = {{ mode = "{mode}", precompile = {str(precompile).lower()}, timeout = "10m" }}
ready = {{ mode = "notify", timeout = "10m" }}
"""


def check_values(processes):
    """Every process computed its own numbers: each function's compiled result is bitwise its eager one."""
    for p in processes:
        assert set(p["metrics"]["functions"]) == set(READS), p["name"]
        for name, r in p["metrics"]["functions"].items():
            assert r["equal"], (p["name"], name, "compiled != eager")


def check_loads(followers, lead, precompile):
    """A follower loaded exactly the functions whose reads are those of the process that compiled (`lead`: its
    rank and world size), and said why it traced the rest (precompile on); with precompile off it traced all."""
    for p in followers:
        me = (p["metrics"]["rank"], p["metrics"]["world"])
        for name, reads in READS.items():
            r = p["metrics"]["functions"][name]
            loaded = precompile and reads(*me) == reads(*lead)
            assert (r["lookups"] == 0) == loaded, (p["name"], me, lead, name, r)
        refused = any(READS[n](*me) != READS[n](*lead) for n in READS)
        if precompile and refused:
            assert p["gate"]["precompiled"] is False and "not exact for this process" in p["gate"]["precompile"], p
        elif precompile:
            assert (p["gate"]["precompiled"], p["gate"]["precompile"]) == (True, "dynamo cache hit"), p["gate"]


def check_exact(followers, leader, precompile):
    """check_values and check_loads, and the rank-free function was compiled once: by the leader."""
    for p in followers + [leader]:
        assert p["exit_code"] == 0 or (p is leader and p["name"].endswith(":warmup")), p  # a warm-up may be stopped
    check_values(followers + [leader])
    compiled_rank_free = [p["name"] for p in followers + [leader] if p["metrics"]["functions"]["rank_free"]["misses"]]
    assert compiled_rank_free == [leader["name"]], compiled_rank_free
    check_loads(followers, (leader["metrics"]["rank"], leader["metrics"]["world"]), precompile)


@pytest.mark.parametrize("precompile", [True, False])
@pytest.mark.parametrize("mode", ["warmup", "serial"])
def test_a_process_computes_its_own_numbers(launch, tmp_path, mode, precompile):
    """Warm-up mode: a world of one compiles, a gloo world of 3 loads. Serial: 3 processes, each at its own rank
    of a fake world of 3, one leads."""
    cfg = write_config(tmp_path, identity_role(3, mode, precompile, "gloo" if mode == "warmup" else "fake"))
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=900) == 0, r.out + r.err
    s = r.summary()
    if mode == "warmup":
        (leader,) = s["warmups"]
        followers = s["processes"]
    else:
        (leader,) = [p for p in s["processes"] if p["gate"]["role"] == "lead"]
        followers = [p for p in s["processes"] if p is not leader]
    assert (leader["metrics"]["world"], len(followers)) == ((1, 3) if mode == "warmup" else (3, 2))
    check_exact(followers, leader, precompile)
    for p in followers + [leader]:  # torch's per-guard "dropped" warnings: the identities are checked, not shown
        assert "is dropped with caching_precompile" not in (tmp_path / p["log"]["stderr"]).read_text(), p["name"]


@pytest.mark.parametrize("precompile", [True, False])
def test_the_cluster_gate_ships_only_what_is_exact(launch, tmp_path, redis_server, precompile):
    """Two node launchers, each with an empty cache of its own: the leader's entry crosses the cluster gate with its
    kernels, and the other node's process, another rank, loads what is exact for it and traces the rest."""
    env = store_env(tmp_path, redis_server.url)
    configs = node_configs(tmp_path, identity_role(1, "serial", precompile, "fake"))
    rid = run_id(f"exact-{precompile}")
    leader, follower = [], []
    for rank, c in enumerate(configs):  # one after the other: node 0 leads the cluster, node 1 fetches
        node = start_node(launch, c, rid, rank, env)
        assert node.wait(timeout=900) == 0, node.out + node.err
        (p,) = node.summary()["processes"]
        (leader if rank == 0 else follower).append(p)
    assert (leader[0]["gate"]["cluster"], follower[0]["gate"]["cluster"]) == ("leader", "fetched"), follower
    assert (leader[0]["metrics"]["rank"], follower[0]["metrics"]["rank"]) == (0, 1)
    check_exact(follower, leader[0], precompile)


def test_seed_then_run_loads_only_what_is_exact(bin_dir, launch, tmp_path):
    """`dflash-launch seed` compiles as the role's first process (serial mode: rank 0 of the 3, DFLASH_WARMUP=1);
    the run's 3 processes all start as followers, and each loads what is exact for it: rank 0 everything."""
    cfg = write_config(tmp_path, identity_role(3, "serial", True, "fake"))
    seeded = subprocess.run([str(bin_dir / "dflash-launch"), "seed", str(cfg)], env=ENV, capture_output=True,
                            text=True, timeout=900)
    assert seeded.returncode == 0, seeded.stdout + seeded.stderr
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=900) == 0, r.out + r.err
    processes = r.summary()["processes"]
    assert [p["gate"]["role"] for p in processes] == ["reuse"] * 3 and all(p["exit_code"] == 0 for p in processes)
    check_values(processes)
    assert all(p["metrics"]["functions"]["rank_free"]["lookups"] == 0 for p in processes)  # the seed's, loaded
    check_loads(processes, (0, 3), True)


def training_role(gate, private):
    return f"""
[[role]]
name = "trainers"
cpu = 3
command = ["{PY}", "{PAYLOADS / 'exact_training.py'}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", OMP_NUM_THREADS = "1", PRIVATE_CACHE = "{int(private)}" }}
gate = {gate}
ready = {{ mode = "notify", timeout = "10m" }}
"""


def test_ddp_and_fsdp2_train_bitwise_as_with_private_caches(launch, tmp_path):
    """The gated run (warm-up mode, precompile on by default: the 3 ranks load the warm-up's entries) against a run
    where every rank compiles into a cache of its own: each rank's 5 losses and grad norms, DDP and FSDP2, bitwise."""
    runs = {}
    for name, gate, private in (("gated", "true", False), ("private", "false", True)):
        (tmp_path / name).mkdir()
        r = launch(write_config(tmp_path / name, training_role(gate, private)), env=ENV)
        assert r.wait(timeout=900) == 0, r.out + r.err
        runs[name] = {p["metrics"]["rank"]: p for p in r.summary()["processes"]}
    assert sorted(runs["gated"]) == sorted(runs["private"]) == [0, 1, 2]
    values = lambda steps: [(s["loss"], s["grad_norm"]) for s in steps]  # noqa: E731
    for rank, p in runs["gated"].items():
        mine, private = p["metrics"]["steps"], runs["private"][rank]["metrics"]["steps"]
        # DDP's entry is loaded (no FX-graph lookup at all); FSDP2's module is a class fully_shard makes per process,
        # which torch's own type guard refuses, so its graphs come from the FX-graph cache: nobody compiles but the
        # warm-up. In the private run every rank compiles for itself.
        assert mine["ddp"][0]["lookups"] == 0, mine["ddp"][0]
        assert mine["fsdp2"][0]["lookups"] > 0 and mine["fsdp2"][0]["misses"] == 0, mine["fsdp2"][0]
        assert private["ddp"][0]["misses"] > 0 and private["fsdp2"][0]["lookups"] > 0, private  # (one graph, twice)
        for model in ("ddp", "fsdp2"):
            assert len(mine[model]) == 5 and values(mine[model]) == values(private[model]), (rank, model)
    # DDP's all-reduce made the ranks' gradients one: its grad norms agree across ranks; FSDP2's are per shard.
    assert len({tuple(s["grad_norm"] for s in p["metrics"]["steps"]["ddp"]) for p in runs["gated"].values()}) == 1


# ---- the entry itself: what loads it, and what it says (one process each, no launcher) ----

ONE = '''
import json, os, sys
{before}
import torch
from torch._dynamo.utils import counters
def step(x):  # an extern kernel only: no C++ build
    return torch.addmm(x, x, x, alpha=int(os.environ["ROLE_RANK"]))
out = torch.compile(step)(torch.eye(2))
if os.environ.get("SAVE") == "1":
    torch.compiler.save_cache_artifacts()  # torch's own save, whoever calls it
facts = None
if "dflash_launch" in sys.modules and os.environ.get("DFLASH_GATE_ROLE") == "reuse":
    facts = sys.modules["dflash_launch"].precompile_facts()
print(json.dumps({{"out": out.tolist(), "hit": counters["dynamo_cache"]["dynamo_cache_hit"],
                  "error": counters["dynamo_cache"]["dynamo_cache_error"],
                  "lookups": counters["inductor"]["fxgraph_cache_hit"] + counters["inductor"]["fxgraph_cache_miss"],
                  "facts": facts}}))
'''


EYE, rank_2 = [[1.0, 0.0], [0.0, 1.0]], [[3.0, 0.0], [0.0, 3.0]]  # eye + rank * eye @ eye, ranks 0 and 2


def one_process(tmp_path, rank, role=None, before="", save=False, hook=True):
    (tmp_path / "one.py").write_text(ONE.format(before=before))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCH_CACHING_PRECOMPILE="1",
               ROLE_RANK=str(rank), SAVE="1" if save else "0", DFLASH_PAYLOAD_HOOK="1" if hook else "0")
    env.pop("NOTIFY_SOCKET", None)
    env.pop("DFLASH_GATE_ROLE", None)
    if role:
        env["DFLASH_GATE_ROLE"] = role
    p = subprocess.run([PY, str(tmp_path / "one.py")], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return __import__("json").loads(p.stdout.strip().splitlines()[-1])


def test_an_entry_torch_saved_without_the_record_is_not_loaded(tmp_path):
    """A process without dflash-launch's recorder (no hook, no import) saves with torch's own call: the entry says
    nothing of what its trace read. A gated follower at another rank, which before the fix ran rank 0's numbers,
    does not install it: it traces, computes its own, and says why."""
    lead = one_process(tmp_path, 0, save=True, hook=False)
    assert lead["out"] == EYE and any((tmp_path / "cache" / "dynamo").iterdir())
    f = one_process(tmp_path, 2, role="reuse")
    assert f["out"] == rank_2 and f["hit"] == 1 and f["lookups"] > 0, f
    assert f["facts"][0] is False and "no record of what the leader's trace read" in f["facts"][1], f


def test_a_python_without_dflash_launch_cannot_load_a_checked_entry(tmp_path):
    """The entry unpickles through dflash_launch.exact_entries: where that cannot be imported (a Python without
    dflash-launch, the hook off), torch's load fails and the process traces, with its own numbers."""
    lead = one_process(tmp_path, 0, role="lead", save=True)
    assert lead["out"] == EYE
    blocked = "sys.modules['dflash_launch'] = None  # as if not installed"
    f = one_process(tmp_path, 2, before=blocked, hook=False)
    assert f["out"] == rank_2 and f["hit"] == 0 and f["error"] == 1 and f["lookups"] > 0, f
    # And a process without the hook that can import dflash_launch checks it all the same: rank 0 loads.
    same = one_process(tmp_path, 0, hook=False)
    assert same["out"] == EYE and same["hit"] == 1 and same["lookups"] == 0, same
    other = one_process(tmp_path, 2, hook=False)
    assert other["out"] == rank_2 and other["lookups"] > 0, other


def test_a_torch_the_checks_were_not_written_for_turns_precompile_off(tmp_path):
    """Where a patch cannot be made (torch moved a function), nothing shared can be shown exact: Dynamo's precompile
    is off in that process, and its facts say why."""
    code = '''
import json, os
import dflash_launch
from dflash_launch import exact_entries
import torch._dynamo
exact_entries._safely(lambda module: module.no_such_function)(torch._dynamo.guards)
print(json.dumps([torch._dynamo.config.caching_precompile, dflash_launch.precompile_facts()]))
'''
    env = dict(os.environ, TORCH_CACHING_PRECOMPILE="1", DFLASH_GATE_ROLE="reuse",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NOTIFY_SOCKET", None)
    p = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    on, (precompiled, why, _) = __import__("json").loads(p.stdout.strip().splitlines()[-1])
    assert on is False and precompiled is False, p.stdout
    assert why.startswith("off: exactness checks unavailable on torch's torch._dynamo.guards (AttributeError"), why


LOCAL_CLASS = '''
import json, os
import torch
import dflash_launch
def make():
    class Scale:  # a class in a local scope: Dynamo's precompile cannot pickle a guard on its instance
        k = 3
    return Scale()
scale = make()
def step(x):
    return torch.addmm(x, x, x, alpha=scale.k)
out = torch.compile(step)(torch.eye(2))
print(json.dumps({"out": out.tolist(), "facts": dflash_launch.precompile_facts()}))
'''


def test_a_frame_dynamo_cannot_save_is_a_bypass_said_once_never_a_crash(tmp_path):
    """torch 2.13 kills a payload whose compiled frame guards an instance of a local class (precompile on, our
    default where the hook loads); and it warns once per dropped identity guard. Here the leader runs on, says once
    that it saved nothing and why, prints none of torch's dropped-guard lines, and a follower computes the same."""
    (tmp_path / "local.py").write_text(LOCAL_CLASS)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCH_CACHING_PRECOMPILE="1")
    env.pop("NOTIFY_SOCKET", None)
    results = {}
    for role in ("lead", "reuse"):
        p = subprocess.run([PY, str(tmp_path / "local.py")], env=dict(env, DFLASH_GATE_ROLE=role),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        results[role] = (__import__("json").loads(p.stdout.strip().splitlines()[-1]), p.stderr)
    (lead, lead_err), (follower, _) = results["lead"], results["reuse"]
    assert lead["out"] == follower["out"] == [[4.0, 0.0], [0.0, 4.0]]
    assert lead["facts"][0] is False and "defined in local scope" in lead["facts"][1], lead
    assert lead["facts"][1].startswith("saved nothing: Dynamo could not serialise a compiled frame"), lead
    assert lead_err.count("precompile artifact not saved (Dynamo could not serialise") == 1, lead_err
    assert "is dropped with caching_precompile" not in lead_err and "Detected a package bypass" not in lead_err
    assert not (tmp_path / "cache" / "dynamo").exists()  # nothing written: the follower traced, with its numbers
    assert follower["facts"][0] is False, follower

"""Exact by construction (issues #37 and #44): every process runs only what its own Dynamo traced, and what processes
share is addressed by the content of a trace (the FX-graph, AOTAutograd and Inductor caches). Real torch.compile,
real worlds (gloo, or torch's fake group where the processes take the gate one by one), real launcher runs; every
assertion compares VALUES (compiled against the process's own eager run), and the cache counters only say who
compiled what.

The matrix (tests/payloads/identity_step.py): compiled functions that read the process's rank and world size, its
environment, a config module's attribute, a function, Enum member, IntEnum or `re` pattern picked by rank, a
rank-dependent slice, a stdlib-named user package; one compiled function handed relu, tanh and sigmoid; an Enum
argument; a global rebound between calls; two lambdas on one line that differ by a constant; functools.partial;
random inside a step; a module-level Generator; and one that reads nothing of the process, x one gated process alone
(the cluster gate's first node), the gate's warm-up mode, serial mode, the cluster gate and `seed`, all with the
default config. With Dynamo's precompile cache (which this product used to turn on) one process alone already
returned relu's values for tanh, TRAIN's branch for EVAL and the old global (exit 0). And DDP and FSDP2 on 3 ranks:
5 steps' losses and grad norms bitwise equal between a gated run and a run where every rank compiles into a cache of
its own."""
import json
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
ENV.pop("TORCH_CACHING_PRECOMPILE", None)
PY = sys.executable
PAYLOADS = ROOT / "tests" / "payloads"
CASES = {"rank_free", "world_and_rank", "group_methods", "environ", "getenv", "module_attribute", "picked",
         "picked_enum", "picked_int_enum", "picked_pattern", "rank_slice", "stdlib_named_package",
         "lambdas_by_constant", "through_one_compiled_function", "enum_argument", "rebound_global",
         "functools_partial", "random_in_the_step", "module_level_generator"}


def identity_role(n, mode, world):
    return f"""
[[role]]
name = "ranks"
cpu = {n}
command = ["{PY}", "{PAYLOADS / 'identity_step.py'}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1", OMP_NUM_THREADS = "1", IDENTITY_WORLD = "{world}" }}
gate = {{ mode = "{mode}", timeout = "10m" }}
ready = {{ mode = "notify", timeout = "10m" }}
"""


def check_values(processes):
    """Every process computed its own numbers: each case's compiled results equal its eager ones, nothing raised,
    and nothing turned on Dynamo's precompile cache or loaded an entry of it."""
    for p in processes:
        m = p["metrics"]
        assert set(m["functions"]) == CASES, p["name"]
        for name, r in m["functions"].items():
            assert r["equal"] and r["error"] is None, (p["name"], name, r, "compiled != eager")
        assert m["caching_precompile"] is False and m["dynamo_cache_hit"] == 0, (p["name"], m)


def check_exact(processes, leader):
    """check_values, and the rank-free function was compiled once, by the leader: the others traced it themselves
    and found its kernels in the FX-graph cache."""
    for p in processes:
        assert p["exit_code"] == 0 or (p is leader and p["name"].endswith(":warmup")), p  # a warm-up may be stopped
    check_values(processes)
    compiled_rank_free = [p["name"] for p in processes if p["metrics"]["functions"]["rank_free"]["misses"]]
    assert compiled_rank_free == [leader["name"]], compiled_rank_free
    for p in processes:
        assert p["metrics"]["functions"]["rank_free"]["lookups"] == 1, p  # each traced, none loaded a trace


@pytest.mark.parametrize("mode", ["warmup", "serial"])
def test_a_process_computes_its_own_numbers(launch, tmp_path, mode):
    """Warm-up mode: a world of one compiles, a gloo world of 3 runs on its cache. Serial: 3 processes, each at its
    own rank of a fake world of 3, one leads."""
    cfg = write_config(tmp_path, identity_role(3, mode, "gloo" if mode == "warmup" else "fake"))
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
    check_exact(followers + [leader], leader)
    for p in followers + [leader]:
        assert "caching_precompile" not in (tmp_path / p["log"]["stderr"]).read_text(), p["name"]


def test_the_cluster_gate_ships_only_what_is_exact(launch, tmp_path, redis_server):
    """Two node launchers, each with an empty cache of its own: the leader's kernels cross the cluster gate, and the
    other node's process, another rank, traces for itself and computes its own numbers on them. The first node's run
    is also the case of one gated process with no follower at all (the default config; node 1 starts after it
    ended): torch 2.13's precompile cache made exactly this process run relu for tanh, TRAIN's branch for EVAL and a
    rebound global's old function. (It was a test of its own; folded in here, the same process and checks.)"""
    env = store_env(tmp_path, redis_server.url)
    env.pop("TORCH_CACHING_PRECOMPILE", None)
    configs = node_configs(tmp_path, identity_role(1, "serial", "fake"))
    rid = run_id("exact")
    leader, follower = [], []
    for rank, c in enumerate(configs):  # one after the other: node 0 leads the cluster, node 1 fetches
        node = start_node(launch, c, rid, rank, env)
        assert node.wait(timeout=900) == 0, node.out + node.err
        (p,) = node.summary()["processes"]
        (leader if rank == 0 else follower).append(p)
        if rank == 0:  # one gated process alone, its run over before anyone else's began: it led and compiled
            assert p["gate"]["role"] == "lead" and p["metrics"]["functions"]["rank_free"]["misses"], p
            check_exact([p], p)  # its own numbers, with no other process running at all
    assert (leader[0]["gate"]["cluster"], follower[0]["gate"]["cluster"]) == ("leader", "fetched"), follower
    assert (leader[0]["metrics"]["rank"], follower[0]["metrics"]["rank"]) == (0, 1)
    check_exact(follower + leader, leader[0])


def test_seed_then_run_computes_its_own_numbers(bin_dir, launch, tmp_path):
    """`dflash-launch seed` compiles as the role's first process (serial mode: rank 0 of the 3, DFLASH_WARMUP=1);
    the run's 3 processes all start as followers, trace for themselves, and the rank-free graph is a cache hit."""
    cfg = write_config(tmp_path, identity_role(3, "serial", "fake"))
    seeded = subprocess.run([str(bin_dir / "dflash-launch"), "seed", str(cfg)], env=ENV, capture_output=True,
                            text=True, timeout=900)
    assert seeded.returncode == 0, seeded.stdout + seeded.stderr
    assert not (tmp_path / "cache" / "dynamo").exists() or not any((tmp_path / "cache" / "dynamo").iterdir())
    r = launch(cfg, env=ENV)
    assert r.wait(timeout=900) == 0, r.out + r.err
    processes = r.summary()["processes"]
    assert [p["gate"]["role"] for p in processes] == ["reuse"] * 3 and all(p["exit_code"] == 0 for p in processes)
    check_values(processes)
    assert all(p["metrics"]["functions"]["rank_free"]["misses"] == 0 for p in processes)  # the seed's kernels


def test_precompile_is_refused_where_it_would_be_shared(bin_dir, tmp_path):
    """Nothing spawned, a clear error (exit 2): gate.precompile = true (removed), TORCH_CACHING_PRECOMPILE=1 in a
    gated role's env or in the launcher's environment; and dflash-worker refuses it for a gated payload of its own."""
    def launcher(verb, role, env=ENV):
        cfg = write_config(tmp_path, role)
        return subprocess.run([str(bin_dir / "dflash-launch"), verb, str(cfg)], env=env, capture_output=True,
                              text=True, timeout=120)
    role = identity_role(1, "serial", "fake")
    r = launcher("check", role.replace('timeout = "10m" }', 'timeout = "10m", precompile = true }', 1))
    assert r.returncode == 2 and "gate.precompile was removed" in r.stderr and "delete the key" in r.stderr, r.stderr
    r = launcher("run", role.replace('IDENTITY_WORLD = "fake"', 'IDENTITY_WORLD = "fake", TORCH_CACHING_PRECOMPILE = "1"'))
    assert r.returncode == 2 and "wrong values" in r.stderr and "TORCH_CACHING_PRECOMPILE" in r.stderr, r.stderr
    r = launcher("run", role, env=dict(ENV, TORCH_CACHING_PRECOMPILE="1"))
    assert r.returncode == 2 and "wrong values" in r.stderr and "launcher's environment" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*/summary.json"))
    assert launcher("check", role.replace('timeout = "10m" }', 'timeout = "10m", precompile = false }', 1)).returncode == 0
    cache = tmp_path / "worker-cache"
    cache.mkdir(mode=0o700)
    w = subprocess.run([str(bin_dir / "dflash-worker"), "--gate-dir", str(cache), "--gate-key", "k", "--",
                        "sh", "-c", "touch " + str(tmp_path / "ran")], env=dict(ENV, TORCH_CACHING_PRECOMPILE="1"),
                       capture_output=True, text=True, timeout=120)
    assert w.returncode == 2 and "wrong values" in w.stderr, w.stderr
    assert not (tmp_path / "ran").exists()  # the payload never ran


PLANTED = '''
import json, os
import torch
from torch._dynamo.utils import counters
def step(x):  # an extern kernel only: no C++ build
    return torch.addmm(x, x, x, alpha=int(os.environ["ROLE_RANK"]))
out = torch.compile(step)(torch.eye(2))
if os.environ.get("SAVE") == "1":
    torch.compiler.save_cache_artifacts()  # torch's own precompile save
print(json.dumps({"out": out.tolist(), "hit": counters["dynamo_cache"]["dynamo_cache_hit"]}))
'''


def test_a_precompile_entry_in_the_cache_is_never_loaded(tmp_path):
    """Someone's process with TORCH_CACHING_PRECOMPILE=1 saved Dynamo's entry (keyed by the function's name and line,
    not by what it traced) into the shared cache dir. A process of ours at another rank, importing dflash_launch,
    never loads it: it traces and computes its own numbers."""
    (tmp_path / "step.py").write_text(PLANTED)
    base = dict(ENV, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), DFLASH_GATE_ROLE="reuse")
    base.pop("NOTIFY_SOCKET", None)
    saver = subprocess.run([PY, str(tmp_path / "step.py")], env=dict(base, TORCH_CACHING_PRECOMPILE="1", SAVE="1",
                                                                     ROLE_RANK="0"),
                           capture_output=True, text=True, timeout=600)
    assert saver.returncode == 0, saver.stderr
    assert any((tmp_path / "cache" / "dynamo").iterdir())
    ours = subprocess.run([PY, "-c", "import dflash_launch; exec(open(%r).read())" % str(tmp_path / "step.py")],
                          env=dict(base, ROLE_RANK="2"), capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stderr
    got = json.loads(ours.stdout.strip().splitlines()[-1])
    assert got == {"out": [[3.0, 0.0], [0.0, 3.0]], "hit": 0}, got


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
    """The gated run (warm-up mode: the 3 ranks trace and find the warm-up's kernels) against a run where every rank
    compiles into a cache of its own: each rank's 5 losses and grad norms, DDP and FSDP2, bitwise."""
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
        # Each rank traces, and its graphs come from the FX-graph cache: nobody compiles but the warm-up. In the
        # private run every rank compiles for itself.
        for model in ("ddp", "fsdp2"):
            assert mine[model][0]["lookups"] > 0 and mine[model][0]["misses"] == 0, (model, mine[model][0])
        assert private["ddp"][0]["misses"] > 0 and private["fsdp2"][0]["lookups"] > 0, private  # (one graph, twice)
        for model in ("ddp", "fsdp2"):
            assert len(mine[model]) == 5 and values(mine[model]) == values(private[model]), (rank, model)
    # DDP's all-reduce made the ranks' gradients one: its grad norms agree across ranks; FSDP2's are per shard.
    assert len({tuple(s["grad_norm"] for s in p["metrics"]["steps"]["ddp"]) for p in runs["gated"].values()}) == 1

"""Shared fixtures: where the built binaries are, and the repository root.

The suite's runs never mix with the user's: every process it starts registers its runs in a registry of the
session's own (XDG_RUNTIME_DIR, so `dflash-launch ps` and `ctl` with no run named see only the user's runs),
and the gates' host-local objects (/dev/shm/sem.dflash-<uid>-<hash> and its .owner) of the cache dirs the tests
made under pytest's temp dir are removed at the end, instead of one pair per test cache piling up."""
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(os.environ.get("DFLASH_BIN", ROOT / "build" / "bin"))
USER_XDG_RUNTIME_DIR = os.environ.get("XDG_RUNTIME_DIR")  # the user's own, before the session replaces it
_SESSION_XDG = None


# Inductor's vector-ISA probe asks the same question in every test's cold cache: g++ builds a test .so per ISA and a
# child dlopens each, ~8 CPU-s per leader and ~1 s per other process, a third of a small real compile. The suite
# skips it (TORCHINDUCTOR_VEC_ISA_OK=1 reaches every process it starts, so leaders and followers keep one key);
# tests/test_isa_verdict.py, which is about the probe, takes it out again. DFLASH_TESTS_ISA_PROBE=1 keeps it.
# pytest-xdist's workers inherit the controller's environment, the variable included: the mark below tells them it
# is the suite's, not the user's (without it a worker kept it for tests/test_isa_verdict.py too, and no probe ran).
ISA_PROBE_SKIPPED = os.environ.get("DFLASH_TESTS_ISA_PROBE_SKIPPED") == "1" or (
    os.environ.get("DFLASH_TESTS_ISA_PROBE") != "1" and "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ)
if ISA_PROBE_SKIPPED:
    os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    os.environ["DFLASH_TESTS_ISA_PROBE_SKIPPED"] = "1"

# Most real-compile tests compile the same small graphs, each in a cold cache of its own, and g++ is two thirds of a
# leader's compile: CXX (what Inductor's config.cpp.cxx reads, and reaches every process the suite starts) is the
# session's kernel store (tests/kernel_store.py), which runs g++ once per distinct kernel and hands later compiles
# of it a copy. Every Inductor step and every cache entry the tests count stays real. The first process to load
# this file (pytest-xdist's controller, or the only one) makes the store; its workers inherit it through the
# environment. DFLASH_TESTS_KERNEL_STORE=0 compiles every kernel with g++.
_KERNEL_STORE_OWNED = None
if os.environ.get("DFLASH_TESTS_KERNEL_STORE") != "0" and "DFLASH_TESTS_KERNEL_STORE_DIR" not in os.environ:
    import kernel_store
    _KERNEL_STORE_OWNED = kernel_store.setup(os.environ)


def with_real_compiler(env):
    """`env` with CXX back to g++ itself: for a test whose point is the window a real compile takes."""
    real = env.get("DFLASH_TESTS_KERNEL_STORE_CXX")
    return dict(env, CXX=real) if real else dict(env)


# `make test-long` (DFLASH_LONG_TESTS=1): the long variants, which `make test` skips. Each runs a shipped example or
# job end to end; the properties they show (exactly once, resume, the gate, restarts and probes) have their own
# shorter tests in `make test`, so the 12 minutes of a first `make test` go to those (docs/design.md, "Test time").
LONG_TESTS = os.environ.get("DFLASH_LONG_TESTS") == "1"


def pytest_configure(config):
    global _SESSION_XDG
    config.addinivalue_line("markers", "long: a long variant, run by `make test-long` (DFLASH_LONG_TESTS=1)")
    _SESSION_XDG = tempfile.mkdtemp(prefix="dflash-tests-xdg-")  # 0700, ours
    os.environ["XDG_RUNTIME_DIR"] = _SESSION_XDG
    # `cache export` signs with the user's archive key (cachelock/archive_key.h): the session's own, not the user's.
    os.environ["DFLASH_ARCHIVE_KEY"] = os.path.join(_SESSION_XDG, "archive.key")


# The longest tests first (from `make test`'s slowest durations, longest first, DFLASH_TESTS_CPU_LOG's wall column):
# pytest-xdist hands out tests in collection order, so one of these collected last would run alone at the end while
# the other workers idle. The builtin's compiled reference first: the demo and seed tests compile the same graphs
# and find their kernels in the session's store only if they start after it. A test
# renamed away from this list only loses its place; every worker sorts the same way, as xdist requires.
SLOWEST_FIRST = [
    "test_builtin.py::test_compiled_reference_from_a_warm_up_agrees_on_the_spool",  # fills the kernel store for
    "test_dflash_8gpu.py::test_the_cpu_twin_runs_to_the_end",                       # the demo's graphs: the demo
    "test_stack_example.py::test_the_stack_example_survives_its_target_servers_crashing",  # and seed tests come
    "test_gate_follows_code.py::test_editing_the_imported_model_module_compiles_again_and_names_it",  # after it
    "test_checkpoint.py::test_kills_at_every_moment_end_with_the_weights_of_a_run_never_killed",
    "test_trust_store.py::test_a_node_that_cannot_prove_the_store_sends_a_squatter_no_secret",
    "test_spool_world.py::test_a_killed_rank_restarts_its_world_and_nothing_is_lost",
    "test_adversarial_cache.py::test_a_real_torch_compile_writes_only_what_the_cache_tools_know",
    "test_demo.py::test_demo_runs_shortened",
    "test_isa_verdict.py::test_a_follower_takes_the_leaders_verdicts_and_runs_no_probe",
    "test_exact_values.py::test_ddp_and_fsdp2_train_bitwise_as_with_private_caches",
    "test_compile_gate.py::test_three_drafters_one_leads_two_reuse",
    "test_cluster_gate.py::test_one_compile_in_the_whole_cluster",
    "test_cluster_gate.py::test_a_leader_killed_mid_compile_hands_over_to_the_other_node",
    "test_compile_gate.py::test_sigkill_of_the_leaders_payload_mid_compile",
    "test_checkpoint.py::test_the_reference_drafter_resumes_in_a_ddp_world_on_the_spool",
    "test_checkpoint.py::test_a_stop_writes_a_checkpoint_the_next_run_resumes_from",
    "test_exact_values.py::test_a_precompile_entry_in_the_cache_is_never_loaded",
    "test_spool_roles.py::test_a_python_target_role_of_two_and_gated_drafters_end_by_themselves",
    "test_exact_values.py::test_seed_then_run_computes_its_own_numbers",
    "test_exact_values.py::test_the_cluster_gate_ships_only_what_is_exact",
    "test_exact_values.py::test_a_process_computes_its_own_numbers",
    "test_spool_world.py::test_the_worked_example_trains_to_the_end",
    "test_checkpoint.py::test_a_checkpoint_at_the_end_of_a_world_whose_rank_0_commits_late",
    "test_checkpoint.py::test_fsdp2_on_three_cpu_ranks_resumes",
    "test_gate_groups.py::test_hold_one_holds_only_the_first_rank",
    "test_gate_groups.py::test_collectives_inside_the_graph_need_the_real_world_size",
    "test_seed_cache.py::test_export_clear_import_verify",
]


# Files whose tests mostly wait (signals, timeouts, sleeping payloads, a paused process: under 0.35 CPU-s per wall-s
# in DFLASH_TESTS_CPU_LOG). Collected last, they ran together at the end of the run with the cores idle; now they
# are spread through it (WAIT_SLOTS), one worker's worth beside the compiling tests.
WAIT_BOUND = {
    "test_pause.py", "test_trust_store.py", "test_multinode_store.py", "test_supervisor.py", "test_network_ready.py",
    "test_slurm.py", "test_metrics.py", "test_watchdog.py", "test_run_files.py", "test_adversarial_proc.py",
    "test_trust_run.py", "test_live_view.py", "test_payload_claims.py", "test_stacks.py",
    "test_direct_readiness.py", "test_redaction.py",
}
# Of the pytest-xdist workers (the Makefile's -n), how many the waiting tests fill and how many the rest; the wall
# seconds a test is expected to take in each group, for the merge (the slowest: SLOWEST_FIRST).
WAIT_SLOTS = 1
BUSY_SLOTS = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "4")) - WAIT_SLOTS)
WALL_S = {"slowest": 20.0, "busy": 3.0, "wait": 2.7}


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def place(item):
        name = f"{item.path.name}::{item.originalname}"
        return rank.get(name, len(rank))
    items.sort(key=place)  # stable: the rest keep their order
    skipped = set()
    if not LONG_TESTS:
        skip = pytest.mark.skip(reason="a long variant: make test-long (DFLASH_LONG_TESTS=1) runs it")
        for item in items:
            if item.get_closest_marker("long"):
                item.add_marker(skip)
                skipped.add(id(item))
    # Each group in its order, merged by when a test would start if WAIT_SLOTS workers ran the waiting group and
    # BUSY_SLOTS the rest: the waiting tests run beside the others instead of after them.
    busy, waiting = [], []
    for item in items:
        (waiting if item.path.name in WAIT_BOUND else busy).append(item)
    starts = []
    for group, slots in ((busy, BUSY_SLOTS), (waiting, WAIT_SLOTS)):
        t = 0.0
        for item in group:
            starts.append((t / slots, item))
            if id(item) not in skipped:
                t += WALL_S["wait" if group is waiting else "slowest" if place(item) < len(rank) else "busy"]
    order = {id(item): k for k, (_, item) in enumerate(sorted(starts, key=lambda s: s[0]))}
    items.sort(key=lambda item: order[id(item)])


# DFLASH_TESTS_CPU_LOG=FILE: one line per test, its CPU seconds (this process and every descendant it reaped, with
# their own reaped descendants), its wall seconds and when it ended (the epoch): where the suite's CPU goes and what
# ran at its tail (docs/benchmarks.md, "make test").
_CPU_LOG = os.environ.get("DFLASH_TESTS_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        yield
        return
    import time
    t0, w0 = os.times(), time.monotonic()
    yield
    t1 = os.times()
    cpu = sum(t1[:4]) - sum(t0[:4])
    with open(_CPU_LOG, "a") as f:
        f.write(f"{cpu:.1f}\t{time.monotonic() - w0:.1f}\t{item.nodeid}\t{time.time():.0f}\n")


def gate_objects_of(cache_dir):
    """The /dev/shm objects of the gate of `cache_dir` (cachelock/gate_dir.cc LocateGate's naming)."""
    name = f"dflash-{os.geteuid()}-{hashlib.sha256(os.path.realpath(cache_dir).encode()).hexdigest()[:16]}"
    return [f"/dev/shm/sem.{name}", f"/dev/shm/{name}.owner"]


def pytest_sessionfinish(session):
    try:
        base = session.config._tmp_path_factory.getbasetemp()
    except (AttributeError, ValueError):
        base = None
    if base is not None:
        for dirpath, dirnames, _ in os.walk(base):
            if ".dflash" not in dirnames:
                continue
            for path in gate_objects_of(dirpath):
                try:
                    os.unlink(path)
                except OSError:
                    pass
    if _SESSION_XDG:
        shutil.rmtree(_SESSION_XDG, ignore_errors=True)
    if _KERNEL_STORE_OWNED:
        import kernel_store
        global _KERNEL_STORE_COUNTS
        _KERNEL_STORE_COUNTS = kernel_store.counts(_KERNEL_STORE_OWNED)
        shutil.rmtree(_KERNEL_STORE_OWNED, ignore_errors=True)


_KERNEL_STORE_COUNTS = None


def pytest_terminal_summary(terminalreporter):
    if _KERNEL_STORE_COUNTS and sum(_KERNEL_STORE_COUNTS):  # the session's own store (after pytest_sessionfinish)
        hits, misses = _KERNEL_STORE_COUNTS
        terminalreporter.write_line(f"kernel store: {misses} g++ runs kept, {hits} served as copies")


@pytest.fixture(scope="session")
def bin_dir():
    if not (BIN / "dflash-launch").exists():
        pytest.fail(f"{BIN}/dflash-launch is not built: run `make build`")
    return BIN


def run(args, **kw):
    """Run a command, capture text output, never raise on a non-zero exit."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run([str(a) for a in args], **kw)


@pytest.fixture
def launch(bin_dir):
    """launch(config, **kw) starts `dflash-launch run` in the background; every
    run still going at the end of the test is killed (its children die with it)."""
    from supervise import Run
    runs = []

    def start(config, **kw):
        r = Run(bin_dir, config, **kw)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.kill()


@pytest.fixture
def redis_server(tmp_path):
    """A private redis-server on a free loopback port, killed at the end of the test (tests/redis_server.py)."""
    from redis_server import RedisServer
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()

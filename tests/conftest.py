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
ISA_PROBE_SKIPPED = os.environ.get("DFLASH_TESTS_ISA_PROBE") != "1" and "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ
if ISA_PROBE_SKIPPED:
    os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"


def pytest_configure(config):
    global _SESSION_XDG
    _SESSION_XDG = tempfile.mkdtemp(prefix="dflash-tests-xdg-")  # 0700, ours
    os.environ["XDG_RUNTIME_DIR"] = _SESSION_XDG
    # `cache export` signs with the user's archive key (cachelock/archive_key.h): the session's own, not the user's.
    os.environ["DFLASH_ARCHIVE_KEY"] = os.path.join(_SESSION_XDG, "archive.key")


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

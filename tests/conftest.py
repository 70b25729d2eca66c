"""Shared fixtures: where the built binaries are, and the repository root."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = pathlib.Path(os.environ.get("DFLASH_BIN", ROOT / "build" / "bin"))


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

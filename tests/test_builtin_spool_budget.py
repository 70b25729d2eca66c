"""The launcher's side of the spool's byte budget and the builtin C++ roles under it (issue #49): `[run]
spool_max_bytes` reaches every process as DFLASH_SPOOL_MAX_BYTES; `check` warns, naming file:line:col and the fix,
when the budget or the spool filesystem's free space cannot hold one frame of [model]; the builtin target stops at
the budget and resumes when the (mapped, C++) drafter acknowledges, every frame consumed exactly once; a frame the
budget can never hold, or a budget that is not a byte count, is a clear error with nothing published."""
import json
import math
import os
import subprocess
import time

import pytest

from conftest import BIN, run
from supervise import write_config
from test_spool import ENV, SMALL, SMALL_ENV

BUILTIN = BIN / "dflash-builtin"
needs_builtin = pytest.mark.skipif(not BUILTIN.exists(), reason="dflash-builtin not built (no LibTorch)")

PRODUCER = """
[[role]]
name = "target"
cpu = 1
builtin = "target"
"""


def check(bin_dir, config):
    return run([bin_dir / "dflash-launch", "check", config, "--json"], env=ENV)


def test_the_budget_reaches_every_process_and_check_warns_when_it_cannot_hold_a_frame(bin_dir, tmp_path):
    # SMALL's frame: 1 x 32 x 3 taps x 32 x fp32 + 32 tokens x 8 + a 4096-byte header bound = 16640 bytes.
    config = write_config(tmp_path, f'spool_dir = "{tmp_path}/spool"\nspool_max_bytes = 10_000\n' + SMALL + PRODUCER)
    r = check(bin_dir, config)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["processes"][0]["env"]
    assert env["DFLASH_SPOOL_MAX_BYTES"] == "10000"
    assert f"{config}:6:19: warning: run.spool_max_bytes: the spool's byte budget cannot hold one frame" in r.stderr
    assert "at least 16640" in r.stderr and "spool_max_bytes = 66560" in r.stderr
    # Enough: no warning, and no key: no variable (the producers take half the free space).
    config.write_text(config.read_text().replace("10_000", "1_000_000"))
    r = check(bin_dir, config)
    assert r.returncode == 0 and "spool_max_bytes" not in r.stderr, r.stderr
    config.write_text(config.read_text().replace("spool_max_bytes = 1_000_000\n", ""))
    r = check(bin_dir, config)
    assert "DFLASH_SPOOL_MAX_BYTES" not in json.loads(r.stdout)["processes"][0]["env"]


def test_check_warns_when_the_spool_filesystem_cannot_hold_one_frame(bin_dir, tmp_path):
    """The real statvfs of the spool's filesystem (the dir does not exist yet: its parent's): a frame of the real
    shape at a batch no /dev/shm holds (10^5 x 102.4 MB)."""
    model = SMALL.replace("hidden = 32", "hidden = 5120").replace("seq_len = 32", "seq_len = 2000") + \
        "batch = 100000\n"
    config = write_config(tmp_path, f'spool_dir = "/dev/shm/dflash-no-such-{os.getpid()}/s"\n' + model + PRODUCER)
    r = check(bin_dir, config)
    assert r.returncode == 0, r.stderr
    assert f"{config}:5:13: warning: run.spool_dir: the spool's filesystem (under /dev/shm/dflash-no-such" in r.stderr
    assert "cannot hold one frame" in r.stderr and "--shm-size" in r.stderr, r.stderr
    # Nothing was made or spawned by check.
    assert not os.path.exists(f"/dev/shm/dflash-no-such-{os.getpid()}")


def test_a_budget_that_is_not_a_byte_count_is_a_config_error(bin_dir, tmp_path):
    for bad in ("0", "-5", '"8GB"'):
        config = write_config(tmp_path, f"spool_max_bytes = {bad}\n" + SMALL + PRODUCER)
        r = check(bin_dir, config)
        assert r.returncode != 0 and f"{config}:5:19: error: run.spool_max_bytes" in r.stderr, (bad, r.stderr)


def builtin_env(spool, **kw):
    return dict(ENV, **SMALL_ENV, DFLASH_SPOOL_DIR=str(spool), DFLASH_SPOOL_PRODUCERS="1", **kw)


@needs_builtin
def test_the_builtin_target_waits_at_the_byte_budget_and_the_mapped_drafter_consumes_exactly_once(tmp_path):
    r = run([BUILTIN, "tap", "--rank", "0", "--seq", "0", "--out", tmp_path / "f.safetensors"],
            env=builtin_env(tmp_path / "x"))
    assert r.returncode == 0, r.stderr
    frame = os.path.getsize(tmp_path / "f.safetensors")
    blocks = math.ceil(frame / 4096) * 4096  # what a frame holds of the filesystem (st_blocks)
    budget = 2 * blocks + 4096  # two frames, never three
    spool = tmp_path / "spool"
    target = subprocess.Popen([BUILTIN, "target", "--samples", "6"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=builtin_env(spool, DFLASH_PROCESS="target:0", DFLASH_SPOOL_MAX_BYTES=str(budget)))
    try:
        ready = spool / "ready"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (ready.exists() and len(os.listdir(ready)) >= 2):
            time.sleep(0.05)
        time.sleep(1.0)  # a producer that ignored the budget would publish all 6 (DFLASH_SPOOL_MAX is 16) by now
        assert len(os.listdir(ready)) == 2 and target.poll() is None, target.stderr.read() if target.poll() else ""
        # The C++ drafter maps each frame, trains, drops the mapping, acknowledges: the target goes on.
        d = run([BUILTIN, "drafter"], env=builtin_env(spool, DFLASH_PROCESS="drafter:0",
                                                      DFLASH_METRICS_FILE=str(tmp_path / "d.json")), timeout=300)
        assert d.returncode == 0, d.stderr
        assert target.wait(timeout=120) == 0, target.stderr.read()
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    assert json.loads((tmp_path / "d.json").read_text())["frames_acked"] == 6
    m = json.loads((spool / "spool.json").read_text())
    assert m["exactly_once"] and m["producers"]["target:0"]["consumed"] == 6, m
    assert all(os.path.getsize(spool / "done" / f) == 0 for f in os.listdir(spool / "done"))


@needs_builtin
@pytest.mark.parametrize("budget, code, says", [
    ("1000", 1, "can never fit the spool's byte budget of 1000 bytes"),
    ("lots", 64, "DFLASH_SPOOL_MAX_BYTES=lots is not a positive byte count"),
])
def test_a_budget_the_builtin_target_cannot_use_is_a_clear_error_with_nothing_published(tmp_path, budget, code,
                                                                                          says):
    spool = tmp_path / "spool"
    r = run([BUILTIN, "target", "--samples", "2"],
            env=builtin_env(spool, DFLASH_PROCESS="target:0", DFLASH_SPOOL_MAX_BYTES=budget))
    assert r.returncode == code and says in r.stderr, (r.returncode, r.stderr)
    assert not (spool / "ready").exists() or not os.listdir(spool / "ready")
    assert not (spool / "tmp").exists() or not [f for f in os.listdir(spool / "tmp") if "target:0-" in f]

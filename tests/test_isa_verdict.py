"""The host's vector-ISA probe verdicts, shared through the cache dir (python/dflash_launch/inductor/isa_verdict.py,
issue #22): a follower skips Inductor's dlopen children; nothing anyone else planted is believed."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ISA_PROBE_SKIPPED, ROOT

pytest.importorskip("torch")
from dflash_launch.inductor import isa_verdict  # noqa: E402

TINY = ROOT / "tests" / "payloads" / "tiny_compile.py"


def gated_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / ".dflash").mkdir(parents=True, mode=0o700)
    return cache


def tiny(tmp_path, cache, role, **env):
    metrics = tmp_path / f"{role}.json"
    e = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), DFLASH_GATE_ROLE=role, DFLASH_METRICS_FILE=str(metrics),
             TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONPATH=str(ROOT / "python"), **env)
    e.pop("NOTIFY_SOCKET", None)
    if ISA_PROBE_SKIPPED:
        e.pop("TORCHINDUCTOR_VEC_ISA_OK", None)  # this file is about the probe (tests/conftest.py skips it elsewhere)
    p = subprocess.run([sys.executable, str(TINY)], env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(metrics.read_text())


def test_a_follower_takes_the_leaders_verdicts_and_runs_no_probe(tmp_path):
    cache = gated_cache(tmp_path)
    lead = tiny(tmp_path, cache, "lead")
    assert lead["isa_probes"] >= 1 and lead["isa_shared"] == 0, lead
    records = list((cache / ".dflash/isa").iterdir())
    assert len(records) == lead["isa_probes"]  # one per ISA that loaded (all of them on this host)
    for r in records:
        assert r.stat().st_mode & 0o777 == 0o600 and len(r.read_text()) == 64
    follower = tiny(tmp_path, cache, "reuse")
    assert follower["isa_probes"] == 0 and follower["isa_shared"] == lead["isa_probes"], follower
    assert follower["fxgraph_cache_hit"] >= 1 and follower["fxgraph_cache_miss"] == 0, follower
    # The opt-out: Inductor's own probe, untouched (not even wrapped), and nothing is written.
    before = {r.name: r.stat().st_mtime_ns for r in records}
    off = tiny(tmp_path, cache, "reuse", DFLASH_ISA_SHARE="0")
    assert off["isa_probes"] == off["isa_shared"] == 0 and off["fxgraph_cache_hit"] >= 1, off
    assert {r.name: r.stat().st_mtime_ns for r in (cache / ".dflash/isa").iterdir()} == before


# ---- in process: the probe is a stand-in, the records and the checks are real ----

@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A wrapped stand-in probe over a real file as the `.so`, in a gated cache; .calls counts the real probes."""
    cache = gated_cache(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.setenv("DFLASH_GATE_ROLE", "reuse")
    monkeypatch.delenv("DFLASH_ISA_SHARE", raising=False)
    so = tmp_path / "probe.so"
    so.write_bytes(b"\x7fELF probe")

    class Probe:
        verdict = True
        calls = 0
        so_path = str(so)
        isa_dir = cache / ".dflash" / "isa"

        def __call__(self):
            return wrapped(None, self.so_path)

    p = Probe()

    def real(_self, _path):
        p.calls += 1
        return p.verdict
    wrapped = isa_verdict.wrap(real)
    return p


def record_of(p):
    (r,) = list(p.isa_dir.iterdir())
    return r


def test_the_second_ask_is_answered_from_the_record(probe):
    assert probe() is True and probe.calls == 1
    assert probe() is True and probe.calls == 1


def test_a_failed_probe_is_never_recorded(probe):
    probe.verdict = False
    assert probe() is False and probe() is False
    assert probe.calls == 2 and not probe.isa_dir.exists()


def test_another_so_or_another_cpu_asks_again(probe, monkeypatch, tmp_path):
    probe()
    (tmp_path / "probe.so").write_bytes(b"\x7fELF rebuilt")
    probe()
    assert probe.calls == 2
    monkeypatch.setattr(isa_verdict, "_cpu_identity", lambda: "model name: another CPU\nflags: sse2")
    probe()
    assert probe.calls == 3


def test_a_record_someone_else_could_have_written_is_not_believed(probe):
    probe()
    r = record_of(probe)
    os.chmod(r, 0o622)  # writable by the group and others
    probe()
    assert probe.calls == 2
    os.chmod(record_of(probe), 0o600)  # the probe rewrote it, ours again
    os.chown(record_of(probe), 65534, 65534)  # another user's (nobody)
    probe()
    assert probe.calls == 3


def test_a_planted_link_or_a_wrong_content_is_not_believed(probe, tmp_path):
    probe()
    r = record_of(probe)
    key = r.read_text()
    elsewhere = tmp_path / "planted"
    elsewhere.write_text(key)
    r.unlink()
    r.symlink_to(elsewhere)
    probe()
    assert probe.calls == 2
    r = record_of(probe)
    r.write_text("0" * 64)
    probe()
    assert probe.calls == 3 and record_of(probe).read_text() == key


def test_a_records_dir_that_is_not_ours_is_neither_read_nor_written(probe):
    probe()
    os.chmod(probe.isa_dir, 0o777)
    probe()
    assert probe.calls == 2
    os.chmod(probe.isa_dir, 0o700)
    os.chown(probe.isa_dir, 65534, 65534)
    probe()
    probe()
    assert probe.calls == 4


def test_no_gate_or_the_opt_out_means_the_probe_runs_and_nothing_is_written(probe, monkeypatch):
    monkeypatch.setenv("DFLASH_ISA_SHARE", "0")
    probe()
    probe()
    monkeypatch.delenv("DFLASH_ISA_SHARE")
    monkeypatch.delenv("DFLASH_GATE_ROLE")
    probe()
    assert probe.calls == 3 and not probe.isa_dir.exists()

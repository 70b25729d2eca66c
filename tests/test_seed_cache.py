"""`dflash-launch seed` and `dflash-launch cache` (issue #7)."""
import io
import json
import os
import subprocess
import tarfile
import threading

from conftest import ROOT, run
from supervise import wait_until, write_config
from test_compile_gate import ENV, drafters

TINY = ROOT / "tests" / "payloads" / "tiny_compile.py"


def tiny_role():
    """One gated process of a tiny real torch.compile (tests/payloads/tiny_compile.py): the archive and verify
    tests are about the cache tools on a real Inductor cache, not about the drafter (the demo test seeds it)."""
    return f"""
[[role]]
name = "drafter"
cpu = 1
command = ["python", "{TINY}"]
env = {{ TORCHINDUCTOR_COMPILE_THREADS = "1" }}
gate = {{ timeout = "10m", mode = "serial" }}
ready = {{ mode = "notify", timeout = "10m" }}
"""


def launch_cmd(bin_dir, *args, **kw):
    kw.setdefault("env", ENV)
    kw.setdefault("timeout", 600)
    return run([bin_dir / "dflash-launch", *args], **kw)


def test_seed_refuses_a_stacked_layout_before_any_compile(bin_dir, tmp_path):
    body = drafters().replace("vocab = 256", 'vocab = 256\ninput_layout = "stacked"')
    cfg = write_config(tmp_path, body)
    r = launch_cmd(bin_dir, "seed", cfg)
    # Exit 2 is a config error, which is decided before anything is spawned (docs/exit-codes.md):
    # no compile ran -- shown by the code and the empty cache, not by a stopwatch.
    assert r.returncode == 2
    assert "taps stacked on a new axis" in r.stderr and "x.reshape(1, 64, 320)" in r.stderr
    assert not any((tmp_path / "cache").iterdir())  # nothing compiled, nothing written


def inventory(cache):
    """relative path -> bytes of every content file (not the gate's, not Inductor's build locks)."""
    out = {}
    for root, _, files in os.walk(cache):
        for f in files:
            p = os.path.join(root, f)
            rel = os.path.relpath(p, cache)
            if rel.startswith("locks/"):
                continue
            if not rel.startswith(".dflash/") or rel.startswith(".dflash/ready/"):
                out[rel] = open(p, "rb").read()
    return out


def test_export_clear_import_verify(bin_dir, tmp_path):
    cfg = write_config(tmp_path, tiny_role())
    assert launch_cmd(bin_dir, "seed", cfg).returncode == 0
    archive = tmp_path / "cache.tar.zst"
    r = launch_cmd(bin_dir, "cache", "export", cfg, archive)
    assert r.returncode == 0, r.stderr
    with_files = inventory(tmp_path / "cache")
    r = launch_cmd(bin_dir, "cache", "clear", cfg)
    assert r.returncode == 0, r.stderr
    assert inventory(tmp_path / "cache") == {}
    r = launch_cmd(bin_dir, "cache", "import", cfg, archive)
    assert r.returncode == 0, r.stderr
    assert inventory(tmp_path / "cache") == with_files
    status = json.loads(launch_cmd(bin_dir, "cache", "status", cfg, "--json").stdout)
    assert status["roles"][0]["ready"] and status["inventory"]["kinds"]["fxgraph"]["files"] > 0
    v = launch_cmd(bin_dir, "seed", cfg, "--verify")
    assert v.returncode == 0 and "0 FX-graph misses" in v.stdout, v.stdout + v.stderr

    # An archive from another torch: refused, with the reason.
    other = tmp_path / "other.tar.gz"
    manifest = json.loads(subprocess.run(["tar", "--zstd", "-xOf", archive, "manifest.json"],
                                         capture_output=True, check=True).stdout)
    manifest["torch_version"] = "2.99.0+cpu"
    with tarfile.open(other, "w:gz") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    before = inventory(tmp_path / "cache")
    r = launch_cmd(bin_dir, "cache", "import", cfg, other)
    assert r.returncode != 0 and "not signed" in r.stderr, r.stderr  # changed after export: no signature of ours
    r = launch_cmd(bin_dir, "cache", "import", cfg, other, "--trust")
    assert r.returncode != 0
    assert "built with torch 2.99.0+cpu" in r.stderr and "--force" in r.stderr
    assert inventory(tmp_path / "cache") == before

    # A corrupted archive: refused, the cache untouched.
    broken = tmp_path / "broken.tar.zst"
    data = bytearray(archive.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    broken.write_bytes(bytes(data))
    assert launch_cmd(bin_dir, "cache", "clear", cfg).returncode == 0
    r = launch_cmd(bin_dir, "cache", "import", cfg, broken)
    assert r.returncode != 0 and "refused" in r.stderr and "untouched" in r.stderr
    assert inventory(tmp_path / "cache") == {}
    assert not [p for p in tmp_path.iterdir() if ".import-" in p.name]  # no staging left behind


def fake_cache(cache, dirs=60):
    """A cache-shaped tree as Inductor names it: two-letter kernel dirs <2>/c<2><hash> with a .cpp, a .so
    and a .py each, and an FX graph entry fxgraph/<2>/f<2><hash>/<entry>."""
    for i in range(dirs):
        d = cache / f"{i:02x}"
        d.mkdir(parents=True)
        for ext in (".cpp", ".so", ".py"):
            (d / f"c{i:02x}k{i}{ext}").write_bytes(os.urandom(4096))
    (cache / "fxgraph" / "ab" / "fabentry").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "fabentry" / "e1").write_bytes(b"x" * 100)


def test_clear_waits_for_the_gate_and_no_reader_sees_half_a_cache(bin_dir, tmp_path):
    cfg = write_config(tmp_path, drafters())
    cache = tmp_path / "cache"
    fake_cache(cache)
    holding, release = tmp_path / "holding", tmp_path / "release"
    # The holder's command runs only once it has the gate: it says so, then holds it until released.
    holder = subprocess.Popen(
        [bin_dir / "dflash-cachelock-run", cache, "--key", "busy", "--", "sh", "-c",
         f"touch '{holding}'; while [ ! -e '{release}' ]; do sleep 0.01; done"],
        stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(holding.exists), "the holder never got the gate"
        # While the gate is held, clear does not start: given 1 s it gives up naming the holder,
        # and has touched nothing.
        before = inventory(cache)
        r = launch_cmd(bin_dir, "cache", "clear", cfg, "--timeout", "1s")
        assert r.returncode == 75, r.stdout + r.stderr
        assert "timed out after 1s waiting for gate" in r.stderr and "(pid " in r.stderr, r.stderr
        assert inventory(cache) == before

        # A clear that waits goes on once the holder lets go; readers never see half a kernel dir.
        bad, stop = [], threading.Event()

        def reader():
            while not stop.is_set():
                for d in list(os.scandir(cache)):
                    if len(d.name) != 2:
                        continue
                    try:
                        names = sorted(os.listdir(d.path))
                    except FileNotFoundError:
                        continue  # gone as a whole: fine
                    if names and len(names) != 3:
                        bad.append((d.name, names))

        t = threading.Thread(target=reader)
        t.start()
        clear = subprocess.Popen([bin_dir / "dflash-launch", "cache", "clear", cfg], env=ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        release.touch()
        out, err = clear.communicate(timeout=120)
        stop.set()
        t.join()
        assert holder.wait(timeout=60) == 0, holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert clear.returncode == 0, out + err
    assert bad == []
    assert [p.name for p in cache.iterdir()] == [".dflash"]

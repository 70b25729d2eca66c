"""Cache tools that touch only cache (issue #12): hostile inputs built at test time.

Each test plays a hostile or careless user against `dflash-launch cache clear|export|import`, `check` and the
gate, and asserts that nothing is lost, leaked or exhausted. Every one of them failed on the code before #12
(see docs/reliability.md, "Cache tools", for what each tried and what held). DFLASH_LONG_TESTS=1 adds the
long variants (a 5 GB archive bomb, a real torch.compile's listing).
"""
import hashlib
import io
import json
import os
import subprocess
import tarfile
import textwrap

import pytest

from conftest import run

LONG = os.environ.get("DFLASH_LONG_TESTS") == "1"
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user (needs root)")


def config(tmp_path, cache_dir):
    """A config whose cache_dir is `cache_dir`: one CPU role, no compile (the cache tools never start it)."""
    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent(f"""\
        [run]
        name = "adv"
        cache_dir = "{cache_dir}"
        log_dir = "{tmp_path / 'runs'}"

        [[role]]
        name = "w"
        cpu = 1
        command = ["true"]
        """))
    return path


def launch(bin_dir, *args, **kw):
    return run([bin_dir / "dflash-launch", *args], **kw)


# Forks and waits for CMD, then writes "exit-code maxrss-KiB" to a file. It runs in a fresh, small interpreter
# because a child's ru_maxrss starts at its parent's RSS at fork (the kernel keeps the old mm's high-water mark
# across exec): forked from this pytest process (torch loaded by other tests: ~235 MiB) every child would
# "peak" at 235 MiB whatever it did.
MEASURE = ("import os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[2:])\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "p.returncode = 0\n"
           "open(sys.argv[1], 'w').write(f'{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}')\n")


def run_measured(args, cwd=None):
    """Runs a command; returns (exit code, stdout, stderr, peak RSS in MiB) of that process alone."""
    import sys
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(mode="r") as result:
        subprocess.run([sys.executable, "-S", "-c", MEASURE, result.name, *[str(a) for a in args]],
                       stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, timeout=600, check=True)
        code, rss_kib = (int(x) for x in open(result.name).read().split())
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(), err.read().decode(), rss_kib / 1024


def tree(root):
    """relative path -> content (files), 'dir' (dirs), '-> target' (links), never following a link."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if rel.startswith(".dflash"):
                continue
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = open(p, "rb").read()
    return out


def inductor_files(cache):
    """Files shaped as torch 2.13 Inductor writes them on CPU (see common/inductor_layout.h)."""
    files = {
        "fxgraph/ep/feppvn56a5jd3ogupzunlzndarqdc/bry4crs32b222lis42": b"fx entry",
        "aotautograd/alm2ybe5e6r6s7m6wkjeese2xdhr4/fm35hswmwjxnqafl": b"aot entry",
        "yn/cyn4k4riezxdmlpirdpn3w7jevsiiga3x3ly.main.so": b"\x7fELF kernel",
        "yn/cyn4k4riezxdmlpirdpn3w7jevsiiga3x3ly.main.cpp": b"// kernel",
        "pf/cpfq4b4vcfv5vjg6slllhqe27txrncroj7htp.py": b"# wrapper",
        "locks/cyn4k4riezxdmlpirdpn3w7jevsiiga3x3ly.lock": b"",
        "fxgraph/ep/.123.456.tmp": b"half written",
    }
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    return files


# ---------------------------------------------------------------------------------------------- clear

def test_clear_of_a_home_dir_removes_only_what_inductor_wrote_and_says_how_much(bin_dir, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    mine = {
        "Documents/thesis.tex": b"\\chapter{Four years}",
        ".bashrc": b"export PS1='$ '",
        "notes.txt": b"todo",
        "go/bin/tool": b"go binary",          # a two-letter dir, like a kernel dir
        "fxgraph/README.md": b"not Inductor's",  # inside a kind dir, but not Inductor's shape
    }
    for rel, data in mine.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    os.symlink("thesis.tex", home / "Documents" / "latest.tex")  # a home has links; not Inductor's business
    ours = inductor_files(home)
    before = tree(home)
    r = launch(bin_dir, "cache", "clear", config(tmp_path, home))
    assert r.returncode == 0, r.stderr
    after = tree(home)
    for rel, data in mine.items():
        assert after.get(rel) == data, f"{rel} was touched"
    assert after["Documents/latest.tex"] == "-> thesis.tex"
    for rel in ours:
        assert rel not in after, f"{rel} (Inductor's) is still there"
    # The count is the truth: exactly the files that went.
    gone = [rel for rel, v in before.items() if v not in ("dir",) and rel not in after]
    assert sorted(gone) == sorted(ours)
    assert f"removed {len(ours)} files" in r.stdout, r.stdout
    for left in ("Documents/ (2 files)", ".bashrc", "notes.txt", "go/bin/ (1 file)", "fxgraph/README.md"):
        assert left in r.stdout, r.stdout


@needs_root
def test_clear_export_import_refuse_a_cache_dir_that_is_another_users_symlink(bin_dir, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: anyone may create a link here
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    files = inductor_files(victim)
    link = shared / "cache"
    os.symlink(victim, link)
    os.lchown(link, NOBODY, NOBODY)  # planted by nobody
    cfg = config(tmp_path, link)
    before = tree(victim)
    # dflash-launch checks cache_dir with the config (exit 2, file:line:col); the gate's own tool says 73.
    for args in (["clear", cfg], ["export", cfg, tmp_path / "out.tar.zst"], ["status", cfg]):
        r = launch(bin_dir, "cache", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"symlink {link} owned by nobody (uid {NOBODY})" in r.stderr, r.stderr
        assert f"rm {link}" in r.stderr
    assert tree(victim) == before and len(files) == 7
    assert not (victim / ".dflash").exists()  # nothing was created through the link
    assert not (tmp_path / "out.tar.zst").exists()
    r = run([bin_dir / "dflash-cachelock-run", link, "--key", "k", "--", "true"])
    assert r.returncode == 73 and f"uid {NOBODY}" in r.stderr, r.stderr
    assert tree(victim) == before


def test_clear_refuses_a_cache_dir_whose_parent_others_can_swap(bin_dir, tmp_path):
    parent = tmp_path / "team"
    parent.mkdir()
    cache = parent / "cache"
    cache.mkdir(mode=0o700)
    inductor_files(cache)
    os.chmod(parent, 0o777)  # anyone may rename cache/ away and put a link in its place
    before = tree(cache)
    r = launch(bin_dir, "cache", "clear", config(tmp_path, cache))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{parent} is writable by group and others (mode 0777, not sticky)" in r.stderr
    assert f"chmod go-w {parent}" in r.stderr
    assert tree(cache) == before


# ------------------------------------------------------------------------------------ secure tree

def test_a_world_writable_subdir_of_the_cache_is_refused_with_the_fix(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    inductor_files(cache)
    os.chmod(cache / "fxgraph", 0o777)
    cfg = config(tmp_path, cache)
    r = launch(bin_dir, "check", cfg)
    assert r.returncode == 2 and f"chmod -R go-w {cache}" in r.stderr, r.stdout + r.stderr
    r = run([bin_dir / "dflash-cachelock-run", cache, "--key", "k", "--", "true"])
    assert r.returncode == 73 and f"{cache}/fxgraph is writable by group and others" in r.stderr, r.stderr


@needs_root
@pytest.mark.parametrize("how", ["foreign", "symlink"])
def test_a_ready_marker_that_is_not_ours_promises_nothing(bin_dir, tmp_path, how):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    ready = cache / ".dflash" / "ready"
    ready.mkdir(parents=True, mode=0o700)
    os.chmod(cache / ".dflash", 0o700)
    record = json.dumps({"key": "drafter", "role": "x", "pid": 1, "host": "h", "published_at": 1.0})
    marker = ready / "drafter.json"
    if how == "foreign":
        marker.write_text(record)
        os.chown(marker, NOBODY, NOBODY)
    else:
        (tmp_path / "forged.json").write_text(record)
        os.symlink(tmp_path / "forged.json", marker)
    r = run([bin_dir / "dflash-cachelock-run", cache, "--key", "drafter", "--", "sh", "-c",
             'echo "role=$DFLASH_GATE_ROLE"'])
    assert "role=reuse" not in r.stdout, "a forged READY marker was trusted"
    assert r.returncode == 73, r.stdout + r.stderr
    assert f"rm {marker}" in r.stderr or f"chown -R 0 {marker}" in r.stderr, r.stderr


# --------------------------------------------------------------------------------------------- export

def test_export_never_follows_a_link_and_the_archive_is_private(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    inductor_files(cache)
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOPSECRET root-only")
    os.chmod(secret, 0o600)
    (cache / "Documents").mkdir()
    (cache / "Documents" / "thesis.tex").write_bytes(b"mine")
    os.symlink(secret, cache / "Documents" / "secret.txt")  # where Inductor never looks: export skips it
    archive = tmp_path / "c.tar.zst"
    old = os.umask(0o022)
    try:
        r = launch(bin_dir, "cache", "export", config(tmp_path, cache), archive)
        assert r.returncode == 0, r.stderr
        assert os.stat(archive).st_mode & 0o777 == 0o600  # created so, not chmod-ed after the fact
        names = subprocess.run(["tar", "--zstd", "-tf", archive], capture_output=True, text=True).stdout.split()
        assert names[0] == "manifest.json"
        assert all(not n.startswith("/") and ".." not in n.split("/") for n in names), names
        assert not [n for n in names if n.startswith("Documents")], names
        data = subprocess.run(["tar", "--zstd", "-xOf", archive], capture_output=True).stdout
        assert b"TOPSECRET" not in data
        assert "skipped Documents/secret.txt (a symlink: never followed)" in r.stderr, r.stderr
        assert "skipped Documents/thesis.tex (not written by Inductor)" in r.stderr
        # A link where Inductor would load a kernel: the whole cache is refused, with the fix.
        os.unlink(archive)
        os.symlink(secret, cache / "yn" / "cynsecret.so")
        r = launch(bin_dir, "cache", "export", config(tmp_path, cache), archive)
        assert r.returncode == 2 and f"rm {cache}/yn/cynsecret.so" in r.stderr, r.stderr
        assert not archive.exists()
        assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]
    finally:
        os.umask(old)


def test_export_streams_a_big_file_in_bounded_memory(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    big = cache / "yn" / "cynbig.so"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(300 << 20)  # sparse: 300 MiB of zeros, no disk
    rc, out, err, rss = run_measured([bin_dir / "dflash-launch", "cache", "export", config(tmp_path, cache),
                                      tmp_path / "c.tar.zst"])
    assert rc == 0, err
    # A whole-file buffer would be >= 300 MiB; the stream is one 256 KiB buffer plus zstd's window.
    assert rss < 100, f"export peaked at {rss:.0f} MiB"


def test_export_on_a_full_disk_names_errno_and_path_and_leaves_nothing(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    k = cache / "yn"
    k.mkdir()
    for i in range(3):
        (k / f"cyn{i}.so").write_bytes(os.urandom(1 << 20))  # incompressible: 3 MiB will not fit in 1 MiB
    full = tmp_path / "full"
    full.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", full], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {m.stderr.strip()}")
    try:
        archive = full / "c.tar.zst"
        r = launch(bin_dir, "cache", "export", config(tmp_path, cache), archive)
        assert r.returncode == 1
        assert f"write {archive}: No space left on device" in r.stderr, r.stderr
        assert "partial archive was removed" in r.stderr
        assert list(full.iterdir()) == []
    finally:
        subprocess.run(["umount", full])


# --------------------------------------------------------------------------------------------- import
# These archives are hand-made, so unsigned: each import vouches for it (--trust) to reach the checks behind the
# signature, which hold for an archive its user trusts too (tests/test_trust_cache.py: the signature itself).

class Zeros(io.RawIOBase):
    """n zero bytes, produced as read: an archive entry of any size without holding it."""

    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def manifest(files, torch="none", device="cpu", keys=()):
    return json.dumps({"format": "dflash-cache/1", "torch_version": torch, "device": device, "created": 1,
                       "host": "h", "keys": list(keys), "files": files}).encode()


def make_archive(path, manifest_bytes, entries):
    """A gzip tar: manifest.json first, then (name, size, fileobj) entries."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest_bytes)
        tar.addfile(info, io.BytesIO(manifest_bytes))
        for name, size, data in entries:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, data)


def entry(name, data):
    return {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def zeros_sha(n):
    h = hashlib.sha256()
    chunk = bytes(1 << 20)
    while n:
        k = min(n, len(chunk))
        h.update(chunk[:k])
        n -= k
    return h.hexdigest()


def import_measured(bin_dir, tmp_path, cache, archive, *extra):
    return run_measured([bin_dir / "dflash-launch", "cache", "import", config(tmp_path, cache), archive, *extra])


@pytest.mark.parametrize("honest", [False, True])
def test_import_of_a_bomb_keeps_memory_bounded(bin_dir, tmp_path, honest):
    """A ~300 KB archive whose entry inflates to 300 MiB. Lying manifest (10 bytes): refused before a byte is
    read. Honest manifest (300 MiB): imported, streamed to disk through one buffer."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    n = 300 << 20
    name = "fxgraph/ab/fabbomb/e"
    claim = {"path": name, "size": n, "sha256": zeros_sha(n)} if honest else entry(name, b"0123456789")
    archive = tmp_path / "bomb.tar.gz"
    make_archive(archive, manifest([claim]), [(name, n, Zeros(n))])
    assert archive.stat().st_size < 2 << 20
    rc, out, err, rss = import_measured(bin_dir, tmp_path, cache, archive, "--force", "--trust")
    assert rss < 100, f"import peaked at {rss:.0f} MiB"
    assert not list((cache / ".dflash").glob("import-*")), "staging left behind"
    if honest:
        assert rc == 0, err
        assert (cache / name).stat().st_size == n
    else:
        assert rc == 1
        assert f"'{name}' is {n} bytes, its manifest says 10: refused before reading it" in err, err
        assert "the cache is untouched" in err
        assert not (cache / "fxgraph").exists()


@pytest.mark.skipif(not LONG, reason="DFLASH_LONG_TESTS=1: a 5 GB archive bomb")
def test_import_of_a_5gb_bomb_keeps_memory_bounded(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    n = 5 << 30
    name = "fxgraph/ab/fabbomb/e"
    archive = tmp_path / "bomb.tar.gz"
    make_archive(archive, manifest([entry(name, b"small")]), [(name, n, Zeros(n))])
    rc, out, err, rss = import_measured(bin_dir, tmp_path, cache, archive, "--force", "--trust")
    assert rc == 1 and "refused before reading it" in err, err
    assert rss < 100, f"import peaked at {rss:.0f} MiB"


@pytest.mark.parametrize("field,value,message", [
    ("torch_version", 5, '"torch_version" must be a string, got number 5'),
    ("device", ["cpu"], '"device" must be a string, got array ["cpu"]'),
    ("files", {"a": 1}, '"files" must be an array of {path, size, sha256}, got object {"a":1}'),
    ("size", "10", 'files[0]: "size" must be a non-negative integer, got string "10"'),
    ("sha256", 7, 'files[0]: "sha256" must be a string, got number 7'),
])
def test_import_refuses_a_manifest_of_the_wrong_types_clearly(bin_dir, tmp_path, field, value, message):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    inductor_files(cache)
    before = tree(cache)
    m = json.loads(manifest([entry("fxgraph/ab/fabx/e", b"data")]))
    if field in m:
        m[field] = value
    else:
        m["files"][0][field] = value
    archive = tmp_path / "typed.tar.gz"
    make_archive(archive, json.dumps(m).encode(), [("fxgraph/ab/fabx/e", 4, io.BytesIO(b"data"))])
    r = launch(bin_dir, "cache", "import", config(tmp_path, cache), archive)
    assert r.returncode == 1, (r.returncode, r.stderr)  # never SIGABRT (-6) from an uncaught type_error
    assert message in r.stderr and "the cache is untouched" in r.stderr, r.stderr
    assert tree(cache) == before


def test_a_failed_rename_in_is_rolled_back_and_the_message_is_true(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = cache / "fxgraph/aa/faax/e"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old entry")
    blocker = cache / "zz/czzblock.so"
    blocker.mkdir(parents=True)  # a directory where the archive has a file: its rename-in fails
    (blocker / "inner").write_bytes(b"x")
    before = tree(cache)
    files = {"fxgraph/aa/faax/e": b"new entry", "fxgraph/bb/fbbx/e": b"another", "zz/czzblock.so": b"kernel",
             ".dflash/ready/drafter.json": b'{"key": "drafter"}'}
    archive = tmp_path / "c.tar.gz"
    make_archive(archive, manifest([entry(n, d) for n, d in files.items()]),
                 [(n, len(d), io.BytesIO(d)) for n, d in files.items()])
    r = launch(bin_dir, "cache", "import", config(tmp_path, cache), archive, "--force", "--trust")
    assert r.returncode == 1
    assert tree(cache) == before  # the replaced entry is back, the new one gone, its dirs gone
    assert f"{cache}/zz/czzblock.so is in the way" in r.stderr, r.stderr
    assert "taken out again: the cache is as it was" in r.stderr, r.stderr
    assert not (cache / ".dflash/ready/drafter.json").exists()
    assert not list((cache / ".dflash").glob("import-*"))


def test_import_refuses_links_and_traversal_in_the_archive(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    # The third: a planted ISA verdict (python/dflash_launch/inductor/isa_verdict.py believes records in .dflash/isa/).
    for name, kind in (("../escape", tarfile.REGTYPE), ("fxgraph/ab/fabx/e", tarfile.SYMTYPE),
                       (".dflash/isa/" + "a" * 32, tarfile.REGTYPE)):
        archive = tmp_path / "evil.tar.gz"
        m = manifest([entry(name, b"data")])
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo("manifest.json")
            info.size = len(m)
            tar.addfile(info, io.BytesIO(m))
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
                tar.addfile(info)
            else:
                info.size = 4
                tar.addfile(info, io.BytesIO(b"data"))
        r = launch(bin_dir, "cache", "import", config(tmp_path, cache), archive, "--force", "--trust")
        assert r.returncode == 1 and "untouched" in r.stderr, r.stderr
        assert not (tmp_path / "escape").exists() and not (cache / "fxgraph").exists()
        assert not (cache / ".dflash/isa").exists()


def test_a_real_torch_compile_writes_only_what_the_cache_tools_know(bin_dir, tmp_path):
    """The layout in common/inductor_layout.h is what torch 2.13 writes: after a real forward+backward compile
    into an empty dir, status sees no foreign file and clear removes every file and leaves nothing listed."""
    import sys
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    code = textwrap.dedent("""\
        import torch
        f = torch.compile(lambda x, y: (x.sin() + y.cos()).relu().sum(dim=1))
        x = torch.randn(8, 16, requires_grad=True)
        f(x, torch.randn(8, 16)).sum().backward()
        """)
    r = run([sys.executable, "-c", code], env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache)), timeout=900)
    assert r.returncode == 0, r.stderr
    files = [rel for rel, v in tree(cache).items() if v != "dir"]
    assert any(f.startswith("fxgraph/") for f in files) and any(f.endswith(".so") for f in files), files
    status = json.loads(launch(bin_dir, "cache", "status", config(tmp_path, cache), "--json").stdout)
    assert status["inventory"]["foreign_files"] == 0, files
    r = launch(bin_dir, "cache", "clear", config(tmp_path, cache))
    assert r.returncode == 0 and f"removed {len(files)} files" in r.stdout and "left" not in r.stdout, r.stdout
    assert [p.name for p in cache.iterdir()] == [".dflash"]

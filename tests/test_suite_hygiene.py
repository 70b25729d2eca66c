"""The suite keeps to itself (tests/conftest.py): its runs are in a registry of the session's own, so a user's
`dflash-launch ps` never lists them, and the /dev/shm objects of its test caches' gates are named as the gate
names them, so the end-of-session sweep removes exactly those."""
import json
import os

from conftest import ROOT, USER_XDG_RUNTIME_DIR, gate_objects_of, run
from supervise import write_config


def test_the_suites_runs_are_not_in_the_users_registry(launch, bin_dir, tmp_path):
    cfg = write_config(tmp_path, '[[role]]\nname = "a"\ncpu = 1\ncommand = ["sleep", "60"]\n')
    r = launch(cfg)
    r.wait_for_log("all 1 processes are running")
    mine = run([bin_dir / "dflash-launch", "ps", "--json"])
    assert mine.returncode == 0, mine.stderr
    assert [x["pid"] for x in json.loads(mine.stdout)] == [r.pid]
    user_env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    if USER_XDG_RUNTIME_DIR:
        user_env["XDG_RUNTIME_DIR"] = USER_XDG_RUNTIME_DIR
    theirs = run([bin_dir / "dflash-launch", "ps", "--json"], env=user_env)
    assert theirs.returncode == 0, theirs.stderr
    assert r.pid not in [x["pid"] for x in json.loads(theirs.stdout)]


def test_the_sweep_names_a_gates_objects_as_the_gate_does(bin_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    r = run([bin_dir / "dflash-cachelock-run", cache, "--key", "k", "--", "true"])
    assert r.returncode == 0, r.stderr
    sem, owner = gate_objects_of(cache)
    assert os.path.exists(sem), sorted(os.listdir("/dev/shm"))
    for path in (sem, owner):  # what the session's end would do, done here so the check is this test's
        if os.path.exists(path):
            os.unlink(path)


def test_the_kernel_store_hands_out_copies_of_what_g_plus_plus_made_for_the_same_input(tmp_path):
    """tests/kernel_store.py (conftest.py's CXX): one g++ run per distinct input in a session; a later compile of
    it gets its own copy (a test that tampers with its cache's .so touches nothing else); other input, other
    flags or a failing compile go to g++ itself."""
    import shutil
    import sys
    import kernel_store
    real = shutil.which("g++")
    store = tmp_path / "store"
    store.mkdir()
    wrapper = ROOT / "tests" / "bin" / "g++"
    base = dict(os.environ, DFLASH_TESTS_KERNEL_STORE_DIR=str(store), DFLASH_TESTS_KERNEL_STORE_CXX=real,
                DFLASH_TESTS_KERNEL_STORE_PY=sys.executable)

    def compile_in(cache, source, *flags, umask=0o022):
        (cache / "ab").mkdir(parents=True, exist_ok=True)
        src, out = cache / "ab" / "cab.cpp", cache / "ab" / "cab.so"
        src.write_text(source)
        r = run([wrapper, src, "-shared", "-fPIC", *flags, "-o", out],
                env=dict(base, TORCHINDUCTOR_CACHE_DIR=str(cache)), preexec_fn=lambda: os.umask(umask))
        return r, out

    one = 'extern "C" int f() { return 1; }\n'
    r, a = compile_in(tmp_path / "a", one)
    assert r.returncode == 0, r.stderr
    assert kernel_store.counts(store) == (0, 1)
    r, b = compile_in(tmp_path / "b", one)  # another test's cache dir, the same kernel
    assert r.returncode == 0, r.stderr
    assert kernel_store.counts(store) == (1, 1)
    assert b.read_bytes() == a.read_bytes() and os.stat(b).st_ino != os.stat(a).st_ino
    assert os.stat(b).st_mode & 0o777 == os.stat(a).st_mode & 0o777 and os.access(b, os.X_OK)
    assert sorted(os.listdir(b.parent)) == ["cab.cpp", "cab.so"]
    b.write_bytes(b"tampered")
    r, c = compile_in(tmp_path / "c", one, umask=0o077)
    assert c.read_bytes() == a.read_bytes() and os.stat(c).st_mode & 0o777 == 0o700  # as the linker would
    assert compile_in(tmp_path / "d", 'extern "C" int f() { return 2; }\n')[0].returncode == 0  # other source
    assert compile_in(tmp_path / "e", one, "-O1")[0].returncode == 0  # other flags
    assert kernel_store.counts(store) == (2, 3)
    r, _ = compile_in(tmp_path / "f", "not C++\n")
    assert r.returncode != 0 and "error" in r.stderr
    assert kernel_store.counts(store) == (2, 3)
    v = run([wrapper, "--version"], env=base)
    assert v.returncode == 0 and v.stdout == run([real, "--version"]).stdout

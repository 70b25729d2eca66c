"""The suite's kernel store: one g++ run per distinct Inductor kernel in a whole pytest session.

Most real-compile tests compile the same small graphs, each in a cold cache dir of its own, and g++ is ~60% of a
leader's CPU (24 runs for the tests' reference drafter: ~17 of ~28 CPU-s, bench/kernel_store/one_leader.py).
conftest.py points CXX (what Inductor's `config.cpp.cxx` reads) at a wrapper that runs `main` here: a compile whose
inputs it has seen in this session gets the output g++ made then, copied to where this one asked for it; anything
else runs the real g++ and keeps a copy. What the tests assert stays real: every process still runs the whole of
Inductor, writes its own kernel sources and .so files into its own cache dir (a copy, never a link, so a test that
tampers with one touches only its own) and fills its own FX graph cache, whose hits and misses the gate counts. Only
the g++ process is skipped.

The key is what decides g++'s output: its arguments, with each input file named by its base name and content
(Inductor writes a kernel to <cache dir>/<2 chars>/<hash>.cpp, and the header it preprocesses for its precompiled-
header key to a fresh temp dir), the output by its base name, and the test's cache dir, wherever it appears, as one
placeholder. The compiler, its headers and torch do not change within a session, and the store lives only as long as
the session.
"""
import hashlib
import os
import shutil
import sys
import tempfile


def _key(args, cache_dir):
    h = hashlib.sha256()
    out = args[args.index("-o") + 1]
    for a in args:
        if a == out:
            h.update(b"out:" + os.path.basename(a).encode())
        elif os.path.isfile(a):
            with open(a, "rb") as f:
                data = f.read()
            if cache_dir:
                data = data.replace(cache_dir.encode(), b"@CACHE@")
            h.update(b"in:" + os.path.basename(a).encode() + b":" + hashlib.sha256(data).digest())
        else:
            h.update(b"arg:" + (a.replace(cache_dir, "@CACHE@") if cache_dir else a).encode())
        h.update(b"\0")
    return h.hexdigest()


def main():
    real_cxx, store = os.environ["DFLASH_TESTS_KERNEL_STORE_CXX"], os.environ["DFLASH_TESTS_KERNEL_STORE_DIR"]
    args = sys.argv[1:]
    if args.count("-o") != 1 or args.index("-o") + 1 >= len(args):
        os.execv(real_cxx, [real_cxx] + args)  # --version, -dumpversion and the like: nothing to keep
    out = args[args.index("-o") + 1]
    if out.endswith(".gch"):  # Inductor keeps its precompiled header itself, once per compiler path, outside the test
        os.execv(real_cxx, [real_cxx] + args)
    cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "").rstrip("/")
    try:
        kept = os.path.join(store, _key(args, cache_dir))
    except OSError:
        os.execv(real_cxx, [real_cxx] + args)
    if os.path.isfile(kept):
        _copy_as_gxx_would(kept, out)
        _note(store, "hit")
        return 0
    rc = os.spawnv(os.P_WAIT, real_cxx, [real_cxx] + args)
    if rc == 0 and os.path.isfile(out):
        tmp = f"{kept}.{os.getpid()}.tmp"
        shutil.copy(out, tmp)
        os.replace(tmp, kept)  # two processes that compiled the same kernel at once: either copy is whole
        _note(store, "miss")
    return rc


def _copy_as_gxx_would(kept, out):
    """A whole file at `out` (never half of one a reader could load) with the mode the linker would give it
    under this process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    tmp = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{os.getpid()}.tmp")
    shutil.copyfile(kept, tmp)
    os.chmod(tmp, (0o777 if os.access(kept, os.X_OK) else 0o666) & ~umask)
    os.replace(tmp, out)


def _note(store, word):
    with open(os.path.join(store, "log"), "a") as f:
        f.write(word + "\n")


def counts(store):
    """(hits, misses) so far in `store`."""
    try:
        with open(os.path.join(store, "log")) as f:
            words = f.read().split()
    except OSError:
        return 0, 0
    return words.count("hit"), words.count("miss")


def setup(environ):
    """Points `environ`'s CXX at tests/bin/g++ with a fresh store behind it; returns the store's path, or None
    where there is no compiler to put it in front of."""
    real_cxx = shutil.which(environ.get("CXX", "g++"))
    if not real_cxx:
        return None
    store = tempfile.mkdtemp(prefix="dflash-tests-kernels-")  # 0700, ours
    environ.update(DFLASH_TESTS_KERNEL_STORE_DIR=store, DFLASH_TESTS_KERNEL_STORE_CXX=real_cxx,
                   DFLASH_TESTS_KERNEL_STORE_PY=sys.executable,
                   CXX=os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "g++"))
    return store


if __name__ == "__main__":
    sys.exit(main())

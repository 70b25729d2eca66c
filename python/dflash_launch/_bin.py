"""The wheel's console scripts: `dflash-launch`, `dflash-worker`, `dflash-cachelock` and `dflash-cachelock-run` exec the binaries
bundled in this package (dflash_launch/bin/). Why not ship the binaries as the wheel's scripts directly: an
executable in <venv>/bin cannot carry a relative RPATH to the libraries auditwheel grafts, because the path
from there to site-packages names the Python version (lib/python3.X/) and the wheel has no Python ABI tag.
In the package directory the RPATH is fixed ($ORIGIN/../../dflash_launch.libs), and `dflash-launch` finds
`dflash-worker` beside itself (/proc/self/exe). execv replaces this Python process: the same PID, signals go
straight to the binary, no extra process stays around.

The payloads' `python`: the directory of the interpreter that runs this script (the venv that holds
dflash-launch, and so normally torch) is put first on PATH, so `command = ["python", ...]` in a config means
that venv's Python whether or not it is activated. DFLASH_KEEP_PATH=1 leaves PATH alone.

`dflash-launch init NAME` is answered here, in Python, before any exec (dflash_launch/tools/starter.py): it only copies
package data, which is where the wheel keeps it.
"""
import os
import sys

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def bin_path(name):
    """The bundled binary `name` (None when this package is a source checkout without the wheel's binaries)."""
    path = os.path.join(BIN_DIR, name)
    return path if os.access(path, os.X_OK) else None


def _exec(name):
    path = bin_path(name)
    if path is None:
        sys.exit(f"{name}: no bundled binary at {os.path.join(BIN_DIR, name)}: this dflash_launch is a source "
                 f"install; build with `make build` and use build/bin/{name}")
    if os.environ.get("DFLASH_KEEP_PATH") != "1":
        venv_bin = os.path.dirname(sys.executable)
        parts = os.environ.get("PATH", "").split(os.pathsep)
        if venv_bin and (not parts or parts[0] != venv_bin):
            os.environ["PATH"] = os.pathsep.join([venv_bin] + [p for p in parts if p and p != venv_bin])
    os.execv(path, [name] + sys.argv[1:])


def dflash_launch():
    if sys.argv[1:2] == ["init"]:  # a starter from the package's examples: Python's, not the binary's (tools/starter.py)
        from dflash_launch.tools.starter import main
        sys.exit(main(sys.argv[2:]))
    _exec("dflash-launch")


def dflash_worker():
    _exec("dflash-worker")


def dflash_cachelock():
    _exec("dflash-cachelock")


def dflash_cachelock_run():
    _exec("dflash-cachelock-run")

"""The spool's C ABI (spool/c_api.h) at the ctypes level (issue #56): the library exports dfs_* and nothing else, a
wait never outlasts its timeout (Python's signal handlers run between waits), the statuses say not yet / end /
error with the library's message, and a SIGTERM reaches a Python handler while a source waits for frames."""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch.spool import SpoolError, _native  # noqa: E402


def test_the_library_exports_the_c_abi_and_nothing_else():
    lib = _native.lib()
    out = subprocess.run(["nm", "-D", "--defined-only", lib._name], capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names and all(n.startswith("dfs_") for n in names), [n for n in names if not n.startswith("dfs_")][:10]
    assert set(_native._SIGNATURES) <= set(names), set(_native._SIGNATURES) - set(names)


def test_a_wait_ends_at_its_timeout_with_not_yet_then_end(tmp_path):
    root = str(tmp_path / "spool")
    c = ctypes.c_void_p()
    _native.call("dfs_consumer_open", root.encode(), b"d:0", 1, ctypes.byref(c))
    frame = _native.Frame()
    t0 = time.monotonic()
    assert _native.lib().dfs_consumer_next(c, 0.2, ctypes.byref(frame)) == _native.NOT_YET
    assert 0.15 < time.monotonic() - t0 < 2.0
    with open(os.path.join(root, "producers", "t:0.done"), "w") as f:
        f.write(json.dumps({"producer": "t:0", "frames": 0}) + "\n")
    assert _native.lib().dfs_consumer_next(c, 0.2, ctypes.byref(frame)) == _native.END
    _native.lib().dfs_consumer_close(c)


def test_an_error_carries_the_librarys_message(tmp_path):
    bad = json.dumps({"t:0": "not a number"}).encode()
    c = ctypes.c_void_p()
    _native.call("dfs_consumer_open", str(tmp_path / "s").encode(), b"d:0", 1, ctypes.byref(c))
    n = ctypes.c_int32()
    try:
        _native.call("dfs_consumer_commit", c, bad, b"ck", b"[]", ctypes.byref(n))
        raise AssertionError("no error")
    except SpoolError as e:
        assert "position of t:0 is not an integer" in str(e)
    _native.lib().dfs_consumer_close(c)


WAITING = """
import signal, sys
sys.path.insert(0, {python!r})
from dflash_launch.spool import SpoolSource
def stop(*a):
    print("handled", flush=True); sys.exit(7)
signal.signal(signal.SIGTERM, stop)
src = SpoolSource({root!r}, "d:0", {{}}, producers=1)
print("waiting", flush=True)
src.next_sample()  # no producer ever publishes
"""


def test_a_sigterm_reaches_the_python_handler_while_a_source_waits(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WAITING.format(python=str(ROOT / "python"), root=str(tmp_path / "s"))],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "waiting\n"
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 7 and p.stdout.read() == "handled\n"
    assert time.monotonic() - t0 < 2.0


def test_the_layout_is_the_librarys_and_the_package_spells_none_of_it():
    """Issue #56: the spool's names are spelled once (contract/spool_layout.h). Python reads them from the library
    (dfs_layout) and writes no state directory, frame extension or format as a literal of its own."""
    import re
    from dflash_launch.spool import EXT, FORMAT, WEIGHTS_FORMAT, Paths, frame_file, parse_frame_file
    names = _native.layout()
    assert set(names["states"]) == {"tmp", "ready", "claimed", "pending", "done", "rejected", "producers", "free"}
    assert (EXT, FORMAT, WEIGHTS_FORMAT) == (names["frame_ext"], names["frame_format"], names["weights_format"])
    p = Paths("/spool")
    assert [getattr(p, s) for s in names["states"]] == [f"/spool/{d}" for d in names["states"].values()]
    assert p.weights == "/spool/" + names["weights_file"]
    f = frame_file("t:0", 7)
    assert f == "t:0-" + "7".zfill(names["seq_digits"]) + names["frame_ext"] and parse_frame_file(f) == ("t:0", 7)
    spelled = re.compile(r"""["'](tmp|ready|claimed|pending|done|rejected|producers|free|weights\.safetensors|"""
                         r"""\.safetensors|dflash-frame/1|dflash-weights/1)["']""")
    found = [f"{q.name}:{i}: {line.strip()}" for q in sorted((ROOT / "python" / "dflash_launch" / "spool").glob("*.py"))
             for i, line in enumerate(q.read_text().splitlines(), 1) if spelled.search(line)]
    assert found == [], found

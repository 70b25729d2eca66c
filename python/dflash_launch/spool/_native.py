"""libdflash_spool.so, the one implementation of the spool's protocol (spool/c_api.h), through ctypes: stdlib only,
so the wheel stays py3-none; loaded at the first use of a spool class (import dflash_launch loads nothing).

Looked for at $DFLASH_SPOOL_LIB, then the package's own copy (dflash_launch/lib/, the wheel's), then a source
checkout's build (<repo>/build/lib/, what `make build` makes). A call releases the GIL and costs well under a
microsecond (docs/benchmarks.md); none waits longer than the timeout it is given, so a caller that loops over short
waits keeps its signal handlers running."""

import ctypes
import json
import os
import threading
from ctypes import POINTER, Structure, byref, c_char, c_char_p, c_double, c_int32, c_int64, c_uint64, c_void_p  # noqa

from dflash_launch.spool.format import SpoolError

OK, NOT_YET, END, ERR, FULL, BAD_FRAME = 0, 1, 2, -1, -2, -3
ABI_VERSION = 1
_lib, _layout, _lock = None, None, threading.Lock()


class SpoolFull(SpoolError):
    """The spool's filesystem cannot hold a frame (ENOSPC): nothing was published, the frame is not lost (the
    producer may publish it again)."""

    __module__ = "dflash_launch.spool"


class Tensor(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_char_p), ("ndim", c_int32), ("shape", POINTER(c_int64)),
                ("data", c_void_p), ("nbytes", c_uint64)]


class Frame(Structure):
    _fields_ = [("file", c_char * 256), ("path", c_char * 4096), ("producer", c_char * 240), ("seq", c_int64),
                ("taken_back", c_int32)]


_P, _S, _I32P, _I64P, _U64P, _OUT = c_void_p, c_char_p, POINTER(c_int32), POINTER(c_int64), POINTER(c_uint64), \
    POINTER(c_void_p)
_SIGNATURES = {  # name: (argtypes, restype); int status unless said
    "dfs_abi_version": [], "dfs_last_error": ([], c_char_p), "dfs_free": ([c_void_p], None), "dfs_layout": [_OUT],
    "dfs_producer_open": [_S, _S, c_int32, c_int64, c_int32, _OUT], "dfs_producer_close": ([_P], None),
    "dfs_producer_next_seq": ([_P], c_int64), "dfs_producer_finished": [_P],
    "dfs_producer_publish": [_P, _S, c_int32, POINTER(Tensor), c_double, _I64P],
    "dfs_producer_publish_shared": [_P, _S, _S, c_int32, POINTER(Tensor), _I32P], "dfs_producer_finish": [_P],
    "dfs_consumer_open": [_S, _S, c_int32, _OUT], "dfs_consumer_close": ([_P], None),
    "dfs_consumer_set_order": [_P, c_int32, c_int32, c_int64], "dfs_consumer_order_skipped": [_P, c_int32, _OUT],
    "dfs_consumer_next": [_P, c_double, POINTER(Frame)], "dfs_consumer_ack": [_P, POINTER(Frame), c_int64, c_int32],
    "dfs_consumer_drop_bytes": [_P, _S], "dfs_consumer_flush": [_P], "dfs_consumer_reject": [_P, POINTER(Frame), _S],
    "dfs_consumer_hold_for_checkpoint": [_P], "dfs_consumer_restore": [_P, c_int64, _S, _S, _I32P],
    "dfs_consumer_commit": [_P, _S, _S, _S, _I32P], "dfs_consumer_pending_bytes": [_P, _I64P],
    "dfs_consumer_count": [_P, _I32P], "dfs_consumer_committed_records": [_P, _OUT],
    "dfs_consumer_write_manifest_if_final": [_P, _S, _I32P], "dfs_map_hits": [_P],
    "dfs_manifest": [_S, c_int32, _I32P, _OUT], "dfs_write_manifest_if_final": [_S, c_int32, _S, _I32P],
    "dfs_spool_bytes": [_S, _S, _I64P], "dfs_default_max_bytes": [_S, _S, _I64P], "dfs_make_private_dir": [_S],
    "dfs_parse_header": [c_void_p, c_uint64, _OUT], "dfs_check_frame": [_S, _S, _S, _OUT],
    "dfs_map": [_P, _S, _OUT, _U64P, _U64P, _U64P], "dfs_unmap": [_P, c_void_p, c_uint64, c_uint64, c_uint64, c_int32],
}


def candidates(env=None):
    """Where the library is looked for, in order."""
    env, here = os.environ if env is None else env, os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    return [env.get("DFLASH_SPOOL_LIB")] * bool(env.get("DFLASH_SPOOL_LIB")) + [
        os.path.join(os.path.dirname(here), "lib", "libdflash_spool.so"),
        os.path.join(repo, "build", "lib", "libdflash_spool.so")]


def _load(path):
    handle = ctypes.CDLL(path)
    for name, sig in _SIGNATURES.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:  # another library, or an older build of this one: not a crash, a place tried
            raise OSError(f"has no {name}: not this package's libdflash_spool.so (an older build?)") from None
        fn.argtypes, fn.restype = sig if isinstance(sig, tuple) else (sig, ctypes.c_int)
    if handle.dfs_abi_version() != ABI_VERSION:
        raise OSError(f"ABI {handle.dfs_abi_version()}, this package speaks {ABI_VERSION}")
    return handle


def lib():
    """The loaded library (once per process), or SpoolError naming every place tried."""
    global _lib
    with _lock:
        tried = []
        for path in candidates() if _lib is None else []:
            try:
                _lib = _load(path) if os.path.exists(path) else None
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            if _lib is not None:
                break
            tried.append(f"{path} (absent)")
        if _lib is None:
            raise SpoolError("the spool's library libdflash_spool.so was not found: tried " + "; ".join(tried) +
                             ". fix: in a source checkout run `make build`; or set DFLASH_SPOOL_LIB to its path")
    return _lib


def check(status):
    """`status` of a dfs_* call if not an error; else SpoolFull, ValueError (BAD_FRAME: the frame's fault) or
    SpoolError, with the library's message."""
    if status >= 0:
        return status
    text = lib().dfs_last_error().decode(errors="replace")
    raise (SpoolFull if status == FULL else ValueError if status == BAD_FRAME else SpoolError)(text)


def call(name, *args):
    return check(getattr(lib(), name)(*args))


def call_text(name, *args, violation=False):
    """A call whose last argument is a char** out: its text (the library's copy freed). violation=True: the text of
    a BAD_FRAME answer (a contract violation), None for OK."""
    out = c_void_p()
    status = getattr(lib(), name)(*args, byref(out))
    if not (violation and status == BAD_FRAME):
        check(status)
    try:
        return ctypes.string_at(out.value).decode() if out.value else None
    finally:
        lib().dfs_free(out)


def call_json(name, *args):
    return json.loads(call_text(name, *args))


def layout():
    """contract/spool_layout.h's names (dfs_layout): the state directories, the frame and weights files' names and
    formats. Read from the library, never spelled here."""
    global _layout
    if _layout is None:
        _layout = call_json("dfs_layout")
    return _layout


def fs(path):
    return os.fsencode(str(path))

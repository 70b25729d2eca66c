"""Inductor's vector-ISA probe, asked once per host and cache instead of once per process (issue #22, item 3).

Before its first C++ kernel every process that uses Inductor builds a tiny test `.so` per vector ISA (found in
the cache dir after the first run) and `dlopen`s each in a child Python (`VecISA._probe_load`): ~1.1 s of a
follower's CPU that answers the same question the leader answered. A positive answer is recorded under
`<cache>/.dflash/isa/`, keyed by what the answer depends on: the probe `.so`'s bytes, the torch it binds against
(version and lib dir), the interpreter, the CPU (`/proc/cpuinfo` model and flags), the machine and the host. A
follower with the same key finds the record and skips the child.

What keeps it "never worse" (docs/cachelock.md, "The ISA probe"):
- only `True` is recorded; a failed or hung probe is asked again by the next process;
- Inductor's config is untouched (`cpp.vec_isa_ok` is in the FX-graph key; setting it would make followers miss);
- a record is believed only if it is a regular file (not a link) owned by this user, writable by nobody else, in
  a directory that is ours too, and its content is the key: another local user cannot plant a verdict;
- it acts only in gated processes (`DFLASH_GATE_ROLE` set, `TORCHINDUCTOR_CACHE_DIR` with the gate's `.dflash/`),
  in payloads that call `dflash_launch.share_isa_probe()`; `DFLASH_ISA_SHARE=0` turns it off.
"""
import hashlib
import json
import os
import platform
import socket
import stat
import sys
import tempfile

from dflash_launch.inductor.on_import import patch_on_import

_stats = {"isa_probes": 0, "isa_shared": 0}
_MODULE = "torch._inductor.cpu_vec_isa"


def stats() -> dict:
    """How this process answered Inductor's ISA probes: run (isa_probes) or from a record (isa_shared)."""
    return dict(_stats)


def _record_dir():
    """<cache>/.dflash/isa when sharing applies here, else None."""
    if os.environ.get("DFLASH_ISA_SHARE", "1") == "0" or not os.environ.get("DFLASH_GATE_ROLE"):
        return None
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not cache or not _ours(os.path.join(cache, ".dflash"), stat.S_ISDIR):
        return None
    return os.path.join(cache, ".dflash", "isa")


def _private(st, is_kind) -> bool:
    """A stat of that kind, owned by this user, writable by nobody else."""
    return is_kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _ours(path, is_kind) -> bool:
    """`path` (no symlink followed) is _private."""
    try:
        return _private(os.lstat(path), is_kind)
    except OSError:
        return False


def _cpu_identity() -> str:
    """The first processor's model and flags: the CPU the verdict is about."""
    keep = ("model name", "flags", "features", "cpu family", "model", "vendor_id")
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                name = line.split(":", 1)[0].strip()
                if name in keep:
                    lines.append(line.strip())
    except OSError:
        return ""
    return "\n".join(lines)


def verdict_key(so_path: str) -> str:
    import torch
    with open(so_path, "rb") as f:
        so = hashlib.sha256(f.read()).hexdigest()
    facts = {"so": so, "torch": torch.__version__,
             "torch_lib": os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib")),
             "python": os.path.realpath(sys.executable), "cpu": _cpu_identity(), "machine": platform.machine(),
             "host": socket.gethostname()}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _believed(d: str, key: str) -> bool:
    if not _ours(d, stat.S_ISDIR):
        return False
    path = os.path.join(d, key[:32])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return _private(os.fstat(f.fileno()), stat.S_ISREG) and f.read(128).decode(errors="replace") == key


def _record(d: str, key: str) -> None:
    """Writes the record (0600, atomically); a failure only means the next process probes."""
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return
    if not _ours(d, stat.S_ISDIR):
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key)
        os.replace(tmp, os.path.join(d, key[:32]))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def wrap(probe_load):
    """VecISA._probe_load, answered from a believed record when there is one."""
    def _probe_load(self, output_path):
        d = _record_dir()
        key = None
        if d is not None:
            try:
                key = verdict_key(output_path)
            except Exception:
                key = None
            if key and _believed(d, key):
                _stats["isa_shared"] += 1
                return True
        ok = probe_load(self, output_path)
        _stats["isa_probes"] += 1
        if ok and key:
            _record(d, key)
        return ok
    _probe_load.dflash_wrapped = True
    return _probe_load


def _patch(module) -> None:
    cls = module.VecISA
    if not getattr(cls._probe_load, "dflash_wrapped", False):
        cls._probe_load = wrap(cls._probe_load)


_installed = False


def install() -> bool:
    """dflash_launch.share_isa_probe(): a no-op (False) unless sharing applies to this process; once."""
    global _installed
    if _record_dir() is None:
        return False
    if not _installed:
        patch_on_import(_MODULE, _patch)
        _installed = True
    return True

"""A spool frame read in place: mapped copy-on-write by libdflash_spool.so (which keeps the ring's mappings for the
next frame written over their files, a write's private copies dropped first), its tensors views of the mapped pages.

MAP_PRIVATE makes a write to a view copy that page for this process: the spool's bytes never change. The hazard a
mapping brings: truncating or reusing a file while a view maps it makes the view's next read a SIGBUS, or show
another frame. So an acknowledged frame's bytes go (back to its producer, or truncated; the name kept as the
record) only once no tensor maps it: Released holds each such frame until its last view died. CPython's reference
count says whether one lives: torch.frombuffer's tensors (and their views) hold the ctypes array over the mapping.
"""

import ctypes
import math
import sys

from dflash_launch.spool import _native

_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
# cudaHostRegisterReadOnly (CUDA >= 11.1): pins without asking for write access, which on a MAP_PRIVATE mapping
# would break copy-on-write for every page.
_CUDA_HOST_REGISTER_READ_ONLY = 0x08


class MappedFrame:
    """A frame file mapped MAP_PRIVATE, its header checked by the C++ reader (ValueError: not a frame that can be
    read as safetensors; SpoolError: the file itself). `consumer`: the library's handle, whose kept mapping of the
    same file is reused."""

    def __init__(self, consumer, path):
        self.consumer, self.file, self.pinned = consumer, path.rsplit("/", 1)[-1], False
        addr, size, dev, ino = _native.c_void_p(), _native.c_uint64(), _native.c_uint64(), _native.c_uint64()
        _native.call("dfs_map", consumer, _native.fs(path), *map(_native.byref, (addr, size, dev, ino)))
        self.addr, self.size, self.key = addr.value, size.value, (dev.value, ino.value)
        self.map = (ctypes.c_uint8 * self.size).from_address(self.addr)
        try:
            h = _native.call_json("dfs_parse_header", self.addr, self.size)
        except BaseException:
            self.release(keep=False)
            raise
        self.meta = h.pop("__metadata__")
        self.layout = {k: (v["dtype"], v["shape"], v["begin"], v["end"]) for k, v in h.items()}

    def tensor(self, torch, name):
        """Tensor `name`: a view of the mapping (no copy), writable copy-on-write."""
        dtype, shape, begin, _ = self.layout[name]
        dt, n = getattr(torch, _TORCH_DTYPES[dtype]), math.prod(shape)
        return torch.frombuffer(self.map, dtype=dt, count=n, offset=begin).view(shape) if n else \
            torch.empty(shape, dtype=dt)

    def in_use(self):
        """Whether a tensor still maps the frame (besides this object's own reference and the call's)."""
        return self.map is not None and sys.getrefcount(self.map) > 2

    def pin(self, torch):
        """Page-locks the mapping for CUDA (read-only): .to("cuda", non_blocking=True) of a view is then an
        asynchronous DMA; False where CUDA is absent or refuses (the views stay pageable)."""
        if not self.pinned and torch.cuda.is_available():
            err = torch.cuda.cudart().cudaHostRegister(self.addr, self.size, _CUDA_HOST_REGISTER_READ_ONLY)
            self.pinned = int(getattr(err, "value", err)) == 0
        return self.pinned

    def release(self, torch=None, keep=True):
        """Unpins and unmaps, or lets the library keep the mapping (never a pinned one); REQUIRES: not in_use()."""
        if self.map is None:
            return
        if self.pinned and torch is not None:
            torch.cuda.cudart().cudaHostUnregister(self.addr)
        keep, self.pinned, self.map = keep and not self.pinned, False, None
        _native.call("dfs_unmap", self.consumer, self.addr, self.size, self.key[0], self.key[1], int(keep))


class Released:
    """Acknowledged frames whose bytes go once no view maps them: drop(frame, file) now if it is unmapped, else at
    the first sweep() after its last view died (the source sweeps at every claim and acknowledgement); the library
    then hands the file back to its producer or truncates it, on a thread of its own (flush() waits for it). `file`
    None: only the mapping goes (a pending frame keeps its bytes for a replay)."""

    def __init__(self, consumer, torch=None, keep_maps=True):
        self.consumer, self.torch, self.keep_maps, self.waiting = consumer, torch, keep_maps, []

    def drop(self, frame, file):
        self.waiting.append((frame, file))
        self.sweep()

    def sweep(self):
        still = [(frame, file) for frame, file in self.waiting if frame is not None and frame.in_use()]
        for frame, file in self.waiting:
            if (frame, file) in still:
                continue
            if frame is not None:  # a pending frame's (file None) is unlinked by its commit: no mapping kept
                frame.release(self.torch, keep=self.keep_maps and file is not None)
            if file is not None:
                _native.call("dfs_consumer_drop_bytes", self.consumer, file.encode())
        self.waiting = still
        return len(still)

    def viewed(self):
        """The frame files a view still maps (by name)."""
        return {frame.file for frame, _ in self.waiting if frame is not None}

    def flush(self):
        _native.call("dfs_consumer_flush", self.consumer)

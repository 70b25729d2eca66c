"""A spool frame read in place: the file mapped copy-on-write (by libdflash_spool.so, which keeps the mappings of
the ring's files for the next frame written over them), its tensors views of the mapped pages.

A 100 MB frame read with f.read() and safetensors.torch.load(bytes) is copied twice; mapped, the consumer's tensors
are the page cache's own pages. MAP_PRIVATE makes a write to a view copy that page for this process: the spool's
bytes never change, and the library drops those copies (MADV_DONTNEED of the private pages /proc/self/pagemap
names) before it reuses a mapping, so a later frame is never read from a copy of an earlier one.

The hazard a mapping brings: truncating or reusing a file while a view maps it makes the view's next read a SIGBUS,
or show another frame. So an acknowledged frame's bytes are dropped (handed back to its producer, or truncated; the
name kept as the record) only once no tensor maps it: Released holds each such frame and drops it at the first
sweep after its last view died. CPython's reference count says whether one lives: torch.frombuffer's tensors (and
every view of them) hold a reference to the ctypes array over the mapping.
"""

import ctypes
import math
import queue
import sys
import threading

from dflash_launch.spool import _native

_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
# cudaHostRegisterReadOnly (CUDA >= 11.1): pins without asking for write access, which on a MAP_PRIVATE mapping
# would break copy-on-write for every page.
_CUDA_HOST_REGISTER_READ_ONLY = 0x08


class MappedFrame:
    """A frame file mapped MAP_PRIVATE, its header checked by the C++ reader (ValueError for a frame that cannot be
    read as safetensors; SpoolError for the file itself). `consumer`: the library's consumer handle, whose kept
    mapping of the same file is reused."""

    def __init__(self, consumer, path):
        self.consumer, self.file = consumer, path.rsplit("/", 1)[-1]
        addr, size, dev, ino = _native.c_void_p(), _native.c_uint64(), _native.c_uint64(), _native.c_uint64()
        _native.call("dfs_map", consumer, _native.fs(path), *map(_native.byref, (addr, size, dev, ino)))
        self.addr, self.size, self.key, self.pinned = addr.value, size.value, (dev.value, ino.value), False
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
        if n == 0:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(self.map, dtype=dt, count=n, offset=begin).view(shape)

    def in_use(self):
        """Whether a tensor still maps the frame (besides this object's own reference and the call's)."""
        return self.map is not None and sys.getrefcount(self.map) > 2

    def pin(self, torch):
        """Page-locks the mapping for CUDA (read-only) so that .to("cuda", non_blocking=True) of a view is an
        asynchronous DMA; False where CUDA is absent or refuses (the views stay pageable)."""
        if self.pinned or not torch.cuda.is_available():
            return self.pinned
        err = torch.cuda.cudart().cudaHostRegister(self.addr, self.size, _CUDA_HOST_REGISTER_READ_ONLY)
        self.pinned = int(getattr(err, "value", err)) == 0
        return self.pinned

    def release(self, torch=None, keep=True):
        """Unpins and unmaps, or lets the library keep the mapping (never a pinned one); REQUIRES: not in_use()."""
        if self.map is None:
            return
        if self.pinned:
            if torch is not None:
                torch.cuda.cudart().cudaHostUnregister(self.addr)
            self.pinned, keep = False, False
        self.map = None
        _native.call("dfs_unmap", self.consumer, self.addr, self.size, self.key[0], self.key[1], int(keep))


class Released:
    """Acknowledged frames whose bytes go once no view maps them: drop(frame, file) now if it is unmapped, else at
    the first sweep() after its last view died (the source sweeps at every claim and acknowledgement); then the
    library hands the file back to its producer or truncates it. `file` None: only the mapping goes (a pending
    frame keeps its bytes for a replay). Freeing a 100 MB tmpfs file's pages costs about a memcpy: a thread of
    this object's own does it (the call leaves the GIL), so the next claim and step do not wait; flush() waits."""

    def __init__(self, consumer, torch=None, keep_maps=True):
        self.consumer, self.torch, self.keep_maps, self.waiting = consumer, torch, keep_maps, []
        self._queue, self._thread, self._pending = queue.SimpleQueue(), None, 0
        self._done = threading.Condition()

    def drop(self, frame, file):
        self.waiting.append((frame, file))
        self.sweep()

    def sweep(self):
        still = []
        for frame, file in self.waiting:
            if frame is not None and frame.in_use():
                still.append((frame, file))
                continue
            if frame is not None:  # a pending frame's (file None) is unlinked by its commit: no mapping kept
                frame.release(self.torch, keep=self.keep_maps and file is not None)
            if file is not None:
                self._drop_later(file)
        self.waiting = still
        return len(still)

    def viewed(self):
        """The frame files a view still maps (by name)."""
        return {frame.file for frame, _ in self.waiting if frame is not None}

    def flush(self):
        with self._done:
            self._done.wait_for(lambda: self._pending == 0)

    def _drop_later(self, file):
        with self._done:
            self._pending += 1
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._drops, name="spool-release", daemon=True)
            self._thread.start()
        self._queue.put(file)

    def _drops(self):
        while True:
            file = self._queue.get()
            try:
                _native.call("dfs_consumer_drop_bytes", self.consumer, file.encode())
            except Exception:  # noqa: BLE001 -- the record (the name) is what counts; bytes left are RAM till the end
                pass
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

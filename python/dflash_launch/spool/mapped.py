"""A spool frame read in place: the file mapped copy-on-write, its tensors views of the mapped pages.

A 100 MB frame read with f.read() and safetensors.torch.load(bytes) is copied twice (page cache -> bytes ->
tensors), 6-7x a memcpy of it; mapped, the consumer's tensors are the page cache's own pages and the contract and
token checks read them there. MAP_PRIVATE makes a write to a view (an in-place op of the trainer) copy that page
for this process: the spool's bytes never change.

The hazard a mapping brings: truncating or reusing a file while a view still maps it makes the view's next read
a SIGBUS. So an acknowledged frame's bytes are dropped (truncated, the name kept as the record) only once no
tensor maps it any more: Released holds each such frame and drops it at the next sweep after its last view died.
CPython's reference count says whether one lives: torch.frombuffer's tensors (and every view of them) hold one
reference to the mmap object, whose buffer they do not keep exported.
"""

import math
import mmap
import os
import queue
import sys
import threading

from dflash_launch.spool.format import header_layout

_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
# cudaHostRegisterReadOnly (CUDA >= 11.1): pins without asking for write access, which on a MAP_PRIVATE mapping
# would break copy-on-write for every page (a 100 MB copy in the kernel).
_CUDA_HOST_REGISTER_READ_ONLY = 0x08


class MappedFrame:
    """A frame file mapped MAP_PRIVATE, its header checked (header_layout: ValueError for a frame that cannot
    be read as safetensors; OSError for the file itself)."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            self.size = os.fstat(fd).st_size
            if self.size == 0:
                raise ValueError("not a safetensors file: the file is empty")
            self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.pinned = False
        self.meta, self.layout = header_layout(self.map)

    def tensor(self, torch, name):
        """Tensor `name`: a view of the mapping (no copy), writable copy-on-write."""
        dtype, shape, begin, _ = self.layout[name]
        dt = getattr(torch, _TORCH_DTYPES[dtype])
        n = math.prod(shape)
        if n == 0:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(self.map, dtype=dt, count=n, offset=begin).view(shape)

    def in_use(self):
        """Whether a tensor still maps the frame (besides this object's own reference and the call's)."""
        return self.map is not None and sys.getrefcount(self.map) > 2

    def pin(self, torch):
        """Page-locks the mapping for CUDA (cudaHostRegister, read-only) so that .to("cuda", non_blocking=True)
        of a view is an asynchronous DMA; False where CUDA is absent or refuses (the views stay pageable)."""
        if self.pinned or not torch.cuda.is_available():
            return self.pinned
        rt = torch.cuda.cudart()
        err = rt.cudaHostRegister(self._address(torch), self.size, _CUDA_HOST_REGISTER_READ_ONLY)
        self.pinned = int(getattr(err, "value", err)) == 0
        return self.pinned

    def _address(self, torch):
        probe = torch.frombuffer(self.map, dtype=torch.uint8, count=1)
        try:
            return probe.data_ptr()
        finally:
            del probe

    def release(self, torch=None):
        """Unpins and unmaps; REQUIRES: not in_use() (a view's next read would fault)."""
        if self.map is None:
            return
        if self.pinned and torch is not None:
            torch.cuda.cudart().cudaHostUnregister(self._address(torch))
            self.pinned = False
        self.map.close()
        self.map = None


def _truncate(path):
    try:
        os.truncate(path, 0)
    except FileNotFoundError:
        pass  # moved on (a cleanup, the end of the run): nothing to drop


class Released:
    """Acknowledged frames whose bytes go once no view maps them: drop(frame, path) now if it is unmapped, else
    at the first sweep() after its last view died (the source sweeps at every claim and acknowledgement).

    Freeing a 100 MB tmpfs file's pages takes about as long as a memcpy of it; a thread of this object's own
    does the truncates, so a consumer's next claim and its step do not wait for them (the syscall leaves the
    GIL). flush() waits for it."""

    def __init__(self, torch=None):
        self.torch, self.waiting = torch, []
        self._queue, self._thread = queue.SimpleQueue(), None
        self._pending = 0
        self._done = threading.Condition()

    def drop(self, frame, path):
        self.waiting.append((frame, path))
        self.sweep()

    def sweep(self):
        still = []
        for frame, path in self.waiting:
            if frame is not None and frame.in_use():
                still.append((frame, path))
                continue
            if frame is not None:
                frame.release(self.torch)
            if path is not None:  # None: only the mapping goes (a pending frame keeps its bytes for a replay)
                self._truncate_later(path)
        self.waiting = still
        return len(still)

    def flush(self):
        """Waits until every truncate handed to the thread is done."""
        with self._done:
            self._done.wait_for(lambda: self._pending == 0)

    def _truncate_later(self, path):
        with self._done:
            self._pending += 1
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._truncates, name="spool-release", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def _truncates(self):
        while True:
            path = self._queue.get()
            try:
                _truncate(path)
            except OSError:
                pass  # the record (the name) is what counts; a byte count left over is only RAM until the end
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

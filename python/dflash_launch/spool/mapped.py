"""A spool frame read in place: the file mapped copy-on-write, its tensors views of the mapped pages.

A 100 MB frame read with f.read() and safetensors.torch.load(bytes) is copied twice (page cache -> bytes ->
tensors), 6-7x a memcpy of it; mapped, the consumer's tensors are the page cache's own pages and the contract and
token checks read them there. MAP_PRIVATE makes a write to a view (an in-place op of the trainer) copy that page
for this process: the spool's bytes never change.

The hazard a mapping brings: truncating or reusing a file while a view still maps it makes the view's next read
a SIGBUS, or show another frame. So an acknowledged frame's bytes are dropped (handed back to its producer,
ring.py, or truncated; the name kept as the record) only once no tensor maps it any more: Released holds each such
frame and drops it at the next sweep after its last view died.
CPython's reference count says whether one lives: torch.frombuffer's tensors (and every view of them) hold one
reference to the mmap object, whose buffer they do not keep exported.
"""

import collections
import ctypes
import math
import mmap
import os
import queue
import resource
import sys
import threading

from dflash_launch.spool import ring
from dflash_launch.spool.format import header_layout

_TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                 "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
# cudaHostRegisterReadOnly (CUDA >= 11.1): pins without asking for write access, which on a MAP_PRIVATE mapping
# would break copy-on-write for every page (a 100 MB copy in the kernel).
_CUDA_HOST_REGISTER_READ_ONLY = 0x08


class MapCache:
    """The mappings of the ring's files (ring.py) this consumer keeps after their frames: a frame written over a
    file it has mapped is read through the same page tables, without the page faults (one per 4 KiB page; at
    100 MB about a memcpy on a VM) nor the munmap.

    A MAP_PRIVATE mapping shows the file's pages as the producer rewrites them, except the pages a write to a view
    copied for this process: put() drops those (MADV_DONTNEED of the pages /proc/self/pagemap says are private
    copies), so a later frame is read from the file, never from a copy of an earlier one. Where pagemap cannot be
    read the mapping is not kept. Keyed by (st_dev, st_ino): a kept mapping holds its file, so the number is not
    reused while it is here. At most `limit` mappings, the oldest unmapped first; by default 64, fewer under a
    low open-files limit (Python's mmap keeps a descriptor of its file: an eighth of RLIMIT_NOFILE at most)."""

    def __init__(self, limit=None):
        if limit is None:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            limit = 64 if soft == resource.RLIM_INFINITY else min(64, soft // 8)
        self.limit, self.hits, self.misses = int(limit), 0, 0
        self._maps = collections.OrderedDict()
        self._pagemap = None
        self._buf = bytearray()

    def take(self, st):
        """The kept mapping of the file `st` (an fstat) describes, if it maps exactly its size; else None."""
        m = self._maps.pop((st.st_dev, st.st_ino), None)
        if m is not None and len(m) != st.st_size:
            m.close()
            m = None
        if m is None:
            self.misses += 1
        else:
            self.hits += 1
        return m

    def put(self, key, m):
        """Keeps mapping `m` of file `key` (REQUIRES: no view of it lives); closes it where it cannot be cleaned,
        or where its file is too small for the ring to take it back (ring.MIN_BYTES)."""
        if self.limit <= 0 or len(m) < ring.MIN_BYTES or not self._drop_private_pages(m):
            m.close()
            return
        self._maps[key] = m
        while len(self._maps) > self.limit:
            self._maps.popitem(last=False)[1].close()

    def _drop_private_pages(self, m):
        page = mmap.PAGESIZE
        try:
            if self._pagemap is None:
                self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            probe = ctypes.c_char.from_buffer(m)
            addr = ctypes.addressof(probe)
            del probe
            n = (len(m) + page - 1) // page
            if len(self._buf) != n * 8:
                self._buf = bytearray(n * 8)
            if os.preadv(self._pagemap, [self._buf], addr // page * 8) != n * 8:
                return False
        except (OSError, TypeError, ValueError):
            return False
        import torch  # a consumer of tensors: SpoolSource required it already
        e = torch.frombuffer(self._buf, dtype=torch.int64)
        # Bit 63: present, 62: swapped, 61: a file (page cache) page. Present and not the file's, or swapped: a
        # copy this process made.
        private = ((e < 0) & (((e >> 61) & 1) == 0)) | (((e >> 62) & 1) == 1)
        idx = private.nonzero().flatten().tolist()
        start = prev = None
        for i in idx + [None]:
            if start is not None and (i is None or i != prev + 1):
                m.madvise(mmap.MADV_DONTNEED, start * page, (prev + 1 - start) * page)
                start = None
            if i is not None and start is None:
                start = i
            prev = i
        return True


class MappedFrame:
    """A frame file mapped MAP_PRIVATE, its header checked (header_layout: ValueError for a frame that cannot
    be read as safetensors; OSError for the file itself). With a MapCache, the mapping a file had before is
    reused (and handed back by release())."""

    def __init__(self, path, cache=None):
        self.file = os.path.basename(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            self.size, self.key = st.st_size, (st.st_dev, st.st_ino)
            if self.size == 0:
                raise ValueError("not a safetensors file: the file is empty")
            self.map = cache.take(st) if cache is not None else None
            if self.map is None:
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

    def release(self, torch=None, cache=None):
        """Unpins and unmaps, or hands the mapping to `cache` (never a pinned one); REQUIRES: not in_use() (a
        view's next read would fault)."""
        if self.map is None:
            return
        if self.pinned:
            if torch is not None:
                torch.cuda.cudart().cudaHostUnregister(self._address(torch))
            self.pinned, cache = False, None
        if cache is not None:
            cache.put(self.key, self.map)
        else:
            self.map.close()
        self.map = None


class Released:
    """Acknowledged frames whose bytes go once no view maps them: drop(frame, path) now if it is unmapped, else
    at the first sweep() after its last view died (the source sweeps at every claim and acknowledgement). Then
    the file goes back to its producer (`recycle(path)`: ring.py), its mapping kept in `cache`; or, where the
    ring does not take it, it is truncated.

    Freeing a 100 MB tmpfs file's pages takes about as long as a memcpy of it; a thread of this object's own
    does the truncates (and the ring's renames), so a consumer's next claim and its step do not wait for them
    (the syscall leaves the GIL). flush() waits for it."""

    def __init__(self, torch=None, cache=None, recycle=None):
        self.torch, self.cache, self.recycle, self.waiting = torch, cache, recycle, []
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
                # A pending frame (path None) is unlinked by its commit: a kept mapping would hold its pages.
                frame.release(self.torch, self.cache if path is not None and self.recycle else None)
            if path is not None:  # None: only the mapping goes (a pending frame keeps its bytes for a replay)
                self._drop_later(path)
        self.waiting = still
        return len(still)

    def viewed(self):
        """The frame files a view still maps (by name)."""
        return {frame.file for frame, _ in self.waiting if frame is not None}

    def flush(self):
        """Waits until every truncate handed to the thread is done."""
        with self._done:
            self._done.wait_for(lambda: self._pending == 0)

    def _drop_later(self, path):
        with self._done:
            self._pending += 1
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._drops, name="spool-release", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def _drops(self):
        while True:
            path = self._queue.get()
            try:
                if not (self.recycle and self.recycle(path)):
                    ring.empty(path)  # not taken by the ring: truncated, the name kept as the record
            except OSError:
                pass  # the record (the name) is what counts; a byte count left over is only RAM until the end
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()

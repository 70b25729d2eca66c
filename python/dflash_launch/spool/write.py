"""The producer's write path and byte budget: a frame written once, from the tensors' own memory, into pages
allocated before the first byte (a file of the ring's, ring.py, or a new one); and backpressure by the bytes the
spool holds, not by its frame count.

safetensors.torch.save builds the whole file in a bytes object first (a copy of the tensors) that write() then
copies into the page cache; here the header is built (the format is 8 bytes of length, a JSON header padded to 8,
the data) and writev(2) copies each tensor straight from its memory into the file (worker/builtin/safetensors.cc
WriteFd does the same). posix_fallocate first claims every page of the frame: a /dev/shm that cannot hold it
fails there, before a byte is written, with nothing published and nothing lost (SpoolFull).
"""

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time

from dflash_launch.spool import ring
from dflash_launch.spool.dirs import frame_names
from dflash_launch.spool.format import SpoolError, st_dtype

#: The share of the spool's filesystem (its free space when the producer starts) the spool may hold by default.
DEFAULT_SHARE = 0.5


class SpoolFull(SpoolError):
    """The spool's filesystem cannot hold a frame (ENOSPC): nothing was published, the frame is not lost (the
    producer may publish it again)."""


def _host_bytes(t):
    """A flat uint8 view of a contiguous CPU tensor's memory (a numpy array: writev takes its buffer)."""
    return t.reshape(-1).view(__import__("torch").uint8).numpy()


def frame_layout(tensors, metadata):
    """(header bytes, [buffers]) of a safetensors file of `tensors` (name -> contiguous CPU tensor), in order."""
    header, offset, bufs = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, 0, []
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": st_dtype(t), "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
        if n:
            bufs.append(_host_bytes(t))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)  # the data section starts 8-aligned
    return len(text).to_bytes(8, "little") + text, bufs


def _open_fresh(path, size):
    """A new private file at `path` with `size` bytes of pages allocated (SpoolFull, the file removed, when the
    filesystem cannot hold them; a filesystem without fallocate allocates as it is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        if e.errno == errno.ENOSPC:
            raise SpoolFull(_full_message(path, size)) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return fd


def write_frame(path, tensors, metadata, reserve=None):
    """Writes `tensors` to a new private file at `path`: under `reserve(size)` (a context manager, the byte
    budget's, that may yield a file of the ring to write over: ring.py) it is that file, renamed to `path`, or a
    new one with its pages allocated first; then one writev from the tensors' memory. SpoolFull (the file
    removed) if the filesystem cannot hold it. Returns the file's size."""
    head, bufs = frame_layout(tensors, metadata)
    size = len(head) + sum(b.nbytes for b in bufs)
    with (reserve(size) if reserve else contextlib.nullcontext()) as reused:
        fd = ring.open_free_file(reused, path, size) if reused is not None else None
        if fd is None:
            fd = _open_fresh(path, size)
    try:
        iov = [memoryview(head)] + [memoryview(b).cast("B") for b in bufs]
        while iov:
            try:
                n = os.writev(fd, iov[:1024])  # IOV_MAX
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise SpoolFull(_full_message(path, size)) from None
                raise
            while iov and n >= len(iov[0]):
                n -= len(iov[0])
                iov.pop(0)
            if iov and n:
                iov[0] = iov[0][n:]
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return size


def _full_message(path, size):
    d = os.path.dirname(os.path.dirname(path))
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        free = -1
    return (f"the spool's filesystem cannot hold a frame of {size} bytes ({free} bytes free under {d}): nothing "
            f"was published and no frame is lost; fix: give the spool room (a larger /dev/shm: docker "
            f"--shm-size, or [run] spool_dir on a larger tmpfs) or a smaller [run] spool_max_bytes so producers "
            f"wait for the drafters before the filesystem fills")


def default_max_bytes(root, env=None):
    """The byte budget: $DFLASH_SPOOL_MAX_BYTES (dflash-launch sets it from [run] spool_max_bytes), else
    DEFAULT_SHARE of the spool filesystem's free space."""
    env = os.environ if env is None else env
    given = env.get("DFLASH_SPOOL_MAX_BYTES", "")
    if given:
        try:
            n = int(given)
        except ValueError:
            raise SpoolError(f"DFLASH_SPOOL_MAX_BYTES={given!r} is not a byte count") from None
        if n <= 0:
            raise SpoolError(f"DFLASH_SPOOL_MAX_BYTES={given!r} must be positive")
        return n
    return max(1, int(shutil.disk_usage(root).free * DEFAULT_SHARE))


def spool_bytes(paths, owner=None):
    """The bytes the spool's frames hold against the budget (`owner`'s frames only, when given): ready/, every
    claimed/<consumer>/, tmp/ (frames being written, their pages allocated) and free/ (the ring's files, kept
    for their producer's next frames: ring.py). Not done/: an acknowledged frame's bytes go once its last view dies,
    and a consumer's loop still holds its last sample while it waits for the next, so counting them would let a
    budget of one frame stop producers and consumers alike; at most one such frame per consumer lingers."""
    dirs = [paths.ready, paths.tmp, paths.free]
    try:
        dirs += [paths.claimed_by(c) for c in os.listdir(paths.claimed)]
    except FileNotFoundError:
        pass
    total = 0
    for d in dirs:
        try:
            with os.scandir(d) as entries:
                for e in entries:
                    if owner is not None and not e.name.startswith(owner + "-"):
                        continue
                    try:
                        total += e.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        pass  # claimed or acknowledged meanwhile
        except FileNotFoundError:
            pass
    return total


def _pick_free(paths, owner, size):
    """(path, bytes) of the file in `owner`'s free/ that best takes a frame of `size` bytes (the smallest that
    holds it, else the largest), and the others; (None, 0) and every file for a frame under ring.MIN_BYTES (never
    written over a file of the ring's); (None, 0), [] without an owner or a free file."""
    files = ring.free_files(paths, owner) if owner is not None else []
    if not files or size < ring.MIN_BYTES:
        return (None, 0), files
    fits = [f for f in files if f[1] >= size]
    best = min(fits, key=lambda f: f[1]) if fits else max(files, key=lambda f: f[1])
    return best, [f for f in files if f is not best]


@contextlib.contextmanager
def reserve_room(paths, size, max_bytes, max_ready, say=None, owner=None):
    """Waits until the spool holds few enough bytes that `size` more stay within `max_bytes` and fewer than
    `max_ready` frames are ready, then holds the spool's budget lock (flock on <spool>/budget.lock) while the
    caller allocates the frame's pages, so producers together never pass the budget. With `owner` (a producer's
    name) only its own frames count, against its share of the budget: a consumer in a fixed order
    (WorldSource) may wait for one producer's next frame while the others' fill ready/, and a shared bound would
    stop the very producer it waits for. A frame larger than the budget would wait forever: SpoolError at once.
    Yields the path of one of `owner`'s files in free/ to write the frame over (its bytes are counted already:
    only what the frame needs beyond them must fit), or None for a new file; free files that stand in the way of
    a frame that needs more are dropped."""
    if size > max_bytes:
        raise SpoolError(f"a frame of {size} bytes can never fit the spool's byte budget of {max_bytes} bytes; "
                         f"fix: raise [run] spool_max_bytes (dflash-launch check says what one frame needs)")
    fd = os.open(os.path.join(paths.root, "budget.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        delay, t0, said = 1e-4, time.monotonic(), False
        while True:
            if len([f for f in frame_names(paths.ready) if owner is None or f.startswith(owner + "-")]) < max_ready:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = spool_bytes(paths, owner)
                (reuse, reuse_bytes), others = (None, 0), []
                if size >= ring.MIN_BYTES or held + size > max_bytes:  # a small frame that fits looks no further
                    (reuse, reuse_bytes), others = _pick_free(paths, owner, size)
                if held + max(0, size - reuse_bytes) > max_bytes and others:
                    for path, _ in others:  # kept for frames of another size: room for this one first
                        ring.drop(path)
                    held = spool_bytes(paths, owner)
                if held + max(0, size - reuse_bytes) <= max_bytes:
                    break
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                held = None
            if say and not said and time.monotonic() - t0 > 60:
                said = True
                say(f"waiting for room in the spool for a frame of {size} bytes: budget {max_bytes} bytes, held "
                    f"{held if held is not None else spool_bytes(paths, owner)}, {len(frame_names(paths.ready))} frames ready")
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        yield reuse
    finally:
        os.close(fd)  # releases the lock

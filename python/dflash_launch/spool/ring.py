"""The ring of reused frame files: an acknowledged frame's file goes back to its producer (free/) instead of being
truncated, and the producer's next frame is written over it.

A fresh 100 MB frame costs its producer the allocation of 25,000 pages (posix_fallocate zeroes each) and the
consumer the truncate that frees them again, each about a memcpy; written over a file whose pages exist, a frame
costs one writev into the page cache. A consumer that keeps the mapping of a file (mapped.MapCache) reads the next
frame written into it without a page fault.

    done/<f> (acknowledged, its last view gone) ──RENAME_EXCHANGE with an empty tmp/<f>.tmp──> done/<f> is the
             empty record, tmp/<f>.tmp holds the bytes ──rename──> free/<f>
    free/<f> (a file of producer p's) ──rename, p only, under the budget lock──> tmp/<p's next frame>.tmp

The exchange keeps the acknowledgement what it was (done/<f> exists at every instant: the manifest and a restart
see the same), and a crash between the two renames leaves tmp/<f>.tmp, which the producer's restart removes
(every <its frame>.tmp in tmp/ is its own leftover) and a consumer's start removes once done/<f> has the record.
free/ counts against its producer's share of the byte budget (write.spool_bytes), so the ring never holds more
than the budget did. A checkpoint's commit moves pending/ -> free/ the committing consumer's own frames that no
view maps (recycle_committed). A finished producer takes nothing back: a consumer truncates its frames as before,
and finish() drops its free files. Frames under MIN_BYTES, a filesystem without renameat2(RENAME_EXCHANGE), and
DFLASH_SPOOL_RING=0 leave the ring off; nothing else changes.
"""

import ctypes
import errno
import os
import stat

from dflash_launch.spool.dirs import frame_names, glibc, parse_frame_file, rename_noreplace

_RENAME_EXCHANGE = 2

#: Frames smaller than this are truncated at their ack, as before the ring: a few pages cost less to allocate
#: and fault in than the ring's renames and scans (the demo's 84 KB frame: 0.6-0.7x the frames/s without the ring;
#: from 0.5 MB on the ring is faster, 2x at 1-2 MB: docs/benchmarks.md). worker/builtin/spool_ring.h: the same.
MIN_BYTES = 256 * 1024


def _exchange(a, b):
    """Swaps two names atomically; False where the kernel or filesystem cannot (the caller truncates instead)."""
    libc = glibc()
    if libc is None:
        return False
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(e, os.strerror(e), b)


def enabled(env=None):
    """False when DFLASH_SPOOL_RING=0: every ack truncates and every frame is a new file, as before the ring (to
    rule the ring out when a run misbehaves; worker/builtin/spool_ring.h reads the same)."""
    return (os.environ if env is None else env).get("DFLASH_SPOOL_RING", "1") != "0"


def _takes(paths, path, f):
    """The producer of frame file `f` at `path` if the ring takes it (on, large enough, its producer still
    publishing), else None."""
    if not enabled():
        return None
    try:  # the size first: a small frame's ack pays one syscall for the ring
        if os.stat(path, follow_symlinks=False).st_size < MIN_BYTES:
            return None
    except FileNotFoundError:
        return None
    pf = parse_frame_file(f)
    return pf[0] if pf is not None and not _finished(paths, pf[0]) else None


def _finished(paths, producer):
    return os.path.exists(os.path.join(paths.producers, f"{producer}.done"))


def empty(path):
    """Truncates a plain file with one name to 0 bytes (its pages freed, whoever maps it); never through a
    link, never blocking on a FIFO; anything else is left as it is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:  # a second name's bytes are not ours to drop
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def drop(path):
    """Frees a file's pages and its name. Emptied first: a consumer's kept mapping of it (MapCache) would
    otherwise keep an unlinked file's pages until that consumer exits."""
    empty(path)
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already, or not a file (nothing of the ring's)


def recycle(paths, done_path):
    """Hands acknowledged frame done/<f> back to its producer: free/<f> gets its bytes, done/<f> stays as the
    empty record. REQUIRES: no view maps it (the producer will write over it). False when the frame's bytes were
    not taken (a frame under MIN_BYTES, its producer finished, or the filesystem cannot exchange names): the
    caller truncates them."""
    f = os.path.basename(done_path)
    producer = _takes(paths, done_path, f)
    if producer is None:
        return False
    hold = os.path.join(paths.tmp, f + ".tmp")
    try:
        os.close(os.open(hold, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False
    try:
        swapped = _exchange(hold, done_path)
    except FileNotFoundError:
        swapped = False  # done/<f> moved on (the end of the run)
    if not swapped:
        drop(hold)
        return False
    try:
        rename_noreplace(hold, os.path.join(paths.free, f))
    except OSError:
        drop(hold)
        return True
    if _finished(paths, producer):  # it finished as we handed the file back: nobody will take it
        drop(os.path.join(paths.free, f))
    return True


def recycle_committed(paths, pending_path, frame):
    """A checkpoint's commit (dirs.commit_pending) of `frame`, still at `pending_path`: its bytes go back to its
    producer (free/<frame>). REQUIRES: no view maps it (the caller knows: its own frame, its views gone). False
    when not taken (as recycle): the caller removes it."""
    producer = _takes(paths, pending_path, frame)
    if producer is None:
        return False
    try:
        rename_noreplace(pending_path, os.path.join(paths.free, frame))
    except OSError:
        return False
    if _finished(paths, producer):
        drop(os.path.join(paths.free, frame))
    return True


def free_files(paths, owner):
    """[(path, allocated bytes)] of producer `owner`'s files in free/: plain files with one name only (anything
    else standing there is never written over nor dropped)."""
    out = []
    try:
        with os.scandir(paths.free) as it:
            for e in it:
                if e.name.startswith(owner + "-") and parse_frame_file(e.name):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                        out.append((e.path, st.st_blocks * 512))
    except FileNotFoundError:
        pass
    return out


def open_free_file(free_path, path, size):
    """The producer's side: its file `free_path` (one of free_files), renamed to `path` and resized to `size`
    bytes with every page allocated, open for writing at offset 0. None (the file dropped) if it is gone, not a
    plain file of ours that nothing else links, or cannot grow: the caller writes a new file then."""
    try:
        os.rename(free_path, path)
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    except FileNotFoundError:
        return None  # dropped meanwhile (its producer's finish(), a restart's cleanup)
    except OSError:
        drop(path)
        return None
    st = os.fstat(fd)
    ok = stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
    try:
        if ok and st.st_size != size:
            os.ftruncate(fd, size)
        if ok and st.st_blocks * 512 < size:
            os.posix_fallocate(fd, 0, size)
    except OSError:
        ok = False
    if not ok:
        os.close(fd)
        drop(path)
    return fd if ok else None


def drop_free(paths, owner):
    """Drops every file of `owner`'s in free/ (its end: nobody writes over them any more)."""
    for path, _ in free_files(paths, owner):
        drop(path)


def remove_leftovers(paths):
    """tmp/<f>.tmp of a frame done/ has: a recycle that died between its two renames (the bytes go)."""
    try:
        names = os.listdir(paths.tmp)
    except FileNotFoundError:
        return
    done = set(frame_names(paths.done))
    for n in names:
        if n.endswith(".tmp") and n[:-4] in done:
            drop(os.path.join(paths.tmp, n))

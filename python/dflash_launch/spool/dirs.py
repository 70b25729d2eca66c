"""The spool's directories: their layout (Paths), made private the way the
builtin roles make them, the renames that publish, claim and acknowledge a
frame, the commit of acknowledged frames with a checkpoint (pending/ -> done/),
and the manifest (spool.json) of what the spool held at its end."""

import ctypes
import errno
import json
import os
import stat

from dflash_launch.spool.format import SpoolError, frame_file, parse_frame_file

def rename_noreplace(src, dst):
    """rename(2) with RENAME_NOREPLACE (glibc renameat2); link+unlink where unsupported."""
    libc = glibc()
    if libc is not None:
        r = libc.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), 1)  # AT_FDCWD, RENAME_NOREPLACE
        if r == 0:
            return
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(e, os.strerror(e), dst)
    os.link(src, dst)
    os.unlink(src)


_LIBC = []


def glibc():
    """The C library (ctypes, errno kept), or None where renameat2 is missing (glibc < 2.28)."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.renameat2  # noqa: B018 (absent before glibc 2.28)
            _LIBC.append(libc)
        except (OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


def _refuse(path, why, fix):
    raise SpoolError(f"refusing spool dir {path}: {why}; another user could replace the hidden-state frames and "
                     f"the shared weights; fix: {fix}")


def private_makedirs(path):
    """mkdir -p `path` (0700) the way the builtin roles do (common/private_files.h):
    walking from /, every directory on the way must be ours or root's and writable
    by nobody else unless sticky (like /dev/shm); a symlink must be ours or root's;
    the last directory must be ours, a real directory, writable by us alone. A
    directory another user made first (EEXIST) is refused, never joined."""
    path = os.path.abspath(str(path))
    me = os.geteuid()
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = "/"
        for i, name in enumerate(parts):
            st = os.fstat(fd)
            if st.st_uid not in (me, 0):
                _refuse(path, f"{here} is owned by uid {st.st_uid}, who could swap {name} for a link of theirs",
                        "use a directory of your own")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                _refuse(path, f"{here} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, not sticky)",
                        f"chmod go-w {here}")
            nxt = os.path.join(here, name)
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            lst = os.stat(name, dir_fd=fd, follow_symlinks=False)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            if stat.S_ISLNK(lst.st_mode):
                if lst.st_uid not in (me, 0):
                    _refuse(path, f"{nxt} is a symlink owned by uid {lst.st_uid}: its owner decides where it leads",
                            f"rm {nxt}")
            else:
                flags |= os.O_NOFOLLOW
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                _refuse(path, f"{nxt} is not a directory ({e.strerror})", f"rm {nxt}")
            os.close(fd)
            fd, here = nfd, nxt
            st = os.fstat(fd)
            if made:
                os.fchmod(fd, 0o700)  # past the umask
            elif i == len(parts) - 1:
                if st.st_uid != me:
                    _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {me})", "use a directory of your own")
                if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    _refuse(path, f"it is writable by others (mode {stat.S_IMODE(st.st_mode):04o})", f"chmod go-w {path}")
    finally:
        os.close(fd)


def create_private(path):
    """A file of ours, 0600, never through a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb")


class Paths:
    def __init__(self, root):
        self.root = str(root)
        for d in ("tmp", "ready", "claimed", "pending", "done", "rejected", "producers", "free"):
            setattr(self, d, os.path.join(self.root, d))
        self.weights = os.path.join(self.root, "weights.safetensors")

    def claimed_by(self, consumer):
        return os.path.join(self.claimed, consumer)

    def pending_of(self, consumer):
        """Acknowledged by `consumer`, not yet committed: <position:010d>.<frame> (docs/checkpoints.md)."""
        return os.path.join(self.pending, consumer)

    def create(self):
        """Every state's directory but pending/: only a consumer that checkpoints makes it (hold_for_checkpoint),
        and dflash-launch keeps a failed run's spool for `run --resume` exactly when pending/ exists."""
        private_makedirs(self.root)
        for d in (self.tmp, self.ready, self.claimed, self.done, self.rejected, self.producers, self.free):
            private_makedirs(d)


def spool_root_from_env(env):
    """$DFLASH_SPOOL_DIR (a from_env constructor's spool), or SpoolError saying who sets it."""
    root = env.get("DFLASH_SPOOL_DIR")
    if not root:
        raise SpoolError("DFLASH_SPOOL_DIR is not set: the spool directory frames go through "
                         "(dflash-launch sets it to <[run] spool_dir>/<run_id>)")
    return root


def entries(d):
    """The names in directory `d`; none when it does not exist (pending/ before any consumer checkpoints)."""
    try:
        return os.listdir(d)
    except FileNotFoundError:
        return []


def frame_names(d):
    try:
        return [f for f in os.listdir(d) if parse_frame_file(f)]
    except FileNotFoundError:
        return []


def atomic_write(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with create_private(tmp) as f:
        f.write(text.encode())
    os.replace(tmp, path)


def pending_name(position, frame):
    """A pending frame's name: the consumer's position (its sample count when it took the frame) first, so the
    names sort in the order the frames were stepped on."""
    return f"{int(position):010d}.{frame}"


def parse_pending(name):
    """(position, frame) of a pending/<consumer>/ name, or None."""
    pos, dot, frame = name.partition(".")
    if not dot or len(pos) != 10 or not pos.isdigit() or not parse_frame_file(frame):
        return None
    return int(pos), frame


def pending_frames(root, consumer):
    """[(position, frame, path)] of `consumer`'s pending frames, in position order."""
    d = Paths(root).pending_of(consumer)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = [(pp[0], pp[1], os.path.join(d, n)) for n in names for pp in [parse_pending(n)] if pp]
    return sorted(out)


def _pending_count(p):
    try:
        return sum(len(os.listdir(os.path.join(p.pending, c))) for c in os.listdir(p.pending))
    except FileNotFoundError:
        return 0


def commit_pending(root, positions, checkpoint, recycle=None):
    """The commit of a checkpoint on the spool: every frame a consumer acknowledged before its position in the
    checkpoint (`positions`: {consumer: position}) moves pending/ -> done/, its record naming `checkpoint`.
    Idempotent (a restore repeats it for the checkpoint it restores: a kill between the checkpoint's rename and
    these renames loses nothing). Returns how many frames it committed. A frame done/ already has was committed
    twice: an error (SpoolError), never silently. `recycle(consumer, frame, path)`: True if it took the frame's
    bytes (the ring, for a frame the caller knows no view maps); else the file is unlinked."""
    p = Paths(root)
    record = json.dumps({"checkpoint": str(checkpoint)}).encode() + b"\n"
    n = 0
    for consumer, position in sorted(positions.items()):
        for pos, frame, path in pending_frames(root, consumer):
            if pos >= position:
                break
            # done/<frame> becomes a new file holding the record (which checkpoint); the pending file is unlinked,
            # never truncated: a consumer may still map it (its last sample's views), and the kernel frees its pages
            # with the last mapping. The bytes are not needed any more: the checkpoint holds what they taught.
            tmp = os.path.join(p.tmp, f"{frame}.commit.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, record)
            finally:
                os.close(fd)
            try:
                rename_noreplace(tmp, os.path.join(p.done, frame))
            except FileExistsError:
                os.unlink(tmp)
                if _committed_by(p.done, [frame])[frame] != str(checkpoint):
                    raise SpoolError(f"frame {frame} was committed before (done/ has it) and again by {checkpoint}: "
                                     f"it entered the model twice; the checkpoint dir and the spool disagree") from None
                # This commit, repeated (a kill between the record's rename and the unlink): finish it.
            if recycle is None or not recycle(consumer, frame, path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            n += 1
    return n


def _committed_by(done_dir, frames):
    """{frame: checkpoint or None}: the record a commit wrote in each done/ frame (empty: acknowledged without a
    checkpoint)."""
    out = {}
    for f in frames:
        try:
            with open(os.path.join(done_dir, f), "rb") as fh:
                data = fh.read(4096)
            out[f] = json.loads(data)["checkpoint"] if data else None
        except (OSError, ValueError, KeyError, TypeError):
            out[f] = None
    return out


def committed_records(root):
    """{frame: checkpoint} of every done/ frame whose record names the checkpoint that committed it (a restore
    checks them against the checkpoints it can take: dflash_launch.Checkpoint)."""
    done = Paths(root).done
    return {f: ck for f, ck in _committed_by(done, frame_names(done)).items() if ck}


def _runs(seqs, by):
    """[[first_seq, last_seq, checkpoint]]: consecutive sequence numbers committed by the same checkpoint."""
    runs = []
    for s in seqs:
        if runs and runs[-1][1] == s - 1 and runs[-1][2] == by[s]:
            runs[-1][1] = s
        else:
            runs.append([s, s, by[s]])
    return runs


def manifest(root, producers):
    """(manifest dict, final): what the spool holds, as C++ spool::Manifest
    reports it. Final when every one of `producers` finished and nothing is
    ready or claimed."""
    p = Paths(root)
    published = {}
    for f in (os.listdir(p.producers) if os.path.isdir(p.producers) else []):
        if f.endswith(".done"):
            try:
                published[f[:-5]] = int(json.load(open(os.path.join(p.producers, f)))["frames"])
            except (OSError, ValueError, KeyError):
                published[f[:-5]] = -1
    ready = frame_names(p.ready)
    claimed = sum(len(frame_names(p.claimed_by(c))) for c in (os.listdir(p.claimed) if os.path.isdir(p.claimed) else []))
    done, done_files = {}, frame_names(p.done)
    for f in done_files:
        prod, seq = parse_frame_file(f)
        done.setdefault(prod, set()).add(seq)
        published.setdefault(prod, -1)
    by_file = _committed_by(p.done, done_files)
    pending = _pending_count(p)
    rejected = sorted(frame_names(p.rejected))
    per, tot_pub, tot_done, miss_tot, unexp_tot = {}, 0, 0, 0, 0
    for prod in sorted(published):
        n, seqs = published[prod], done.get(prod, set())
        missing = [s for s in range(n) if s not in seqs] if n >= 0 else []
        unexpected = [s for s in sorted(seqs) if s >= n] if n >= 0 else []
        per[prod] = {"published": n if n >= 0 else None, "consumed": len(seqs),
                     "first_seq": min(seqs) if seqs else None, "last_seq": max(seqs) if seqs else None,
                     "missing": len(missing), "missing_seqs": missing[:20],
                     "unexpected": len(unexpected), "unexpected_seqs": unexpected[:20],
                     "committed_by": _runs(sorted(seqs), {s: by_file.get(frame_file(prod, s)) for s in seqs})}
        tot_pub += max(0, n)
        tot_done += len(seqs)
        miss_tot += len(missing)
        unexp_tot += len(unexpected)
    finished = sum(1 for n in published.values() if n >= 0)
    final = producers > 0 and finished >= producers and not ready and claimed == 0 and pending == 0
    checkpoints = {}
    for ck in by_file.values():
        if ck is not None:
            checkpoints[ck] = checkpoints.get(ck, 0) + 1
    return {"format": "dflash-spool/1", "final": final, "producers_expected": producers,
            "producers_finished": finished, "frames_published": tot_pub, "frames_consumed": tot_done,
            "ready": len(ready), "claimed": claimed, "pending": pending, "rejected": rejected,
            "committed_by_checkpoint": checkpoints,
            "exactly_once": final and tot_pub == tot_done and miss_tot == 0 and unexp_tot == 0 and not rejected,
            "producers": per}, final


def write_manifest_if_final(root, producers, path):
    """Writes the manifest to `path` if the spool is final; True if it did.
    Called by a consumer after each ack and by a producer after its end
    marker: whoever makes the state final sees it (they all write the same)."""
    p = Paths(root)
    try:
        finished = sum(f.endswith(".done") for f in os.listdir(p.producers))
    except FileNotFoundError:
        return False
    if producers <= 0 or finished < producers or frame_names(p.ready) or _pending_count(p):
        return False
    m, final = manifest(root, producers)
    if final:
        atomic_write(path, json.dumps(m, indent=2) + "\n")
    return final


def default_manifest_path(root, env=None):
    env = os.environ if env is None else env
    run_dir = env.get("DFLASH_RUN_DIR")
    return os.path.join(run_dir, "spool.json") if run_dir else os.path.join(str(root), "spool.json")

"""The hidden-state spool, Python side: the same protocol as the builtin roles
(worker/builtin/spool.h; docs/builtin.md), on a plain directory (default under
/dev/shm) and atomic renames.

    tmp/        a producer writes a frame here first
    ready/      published: <producer>-<seq:010d>.safetensors (rename, never replacing)
    claimed/<consumer>/   claimed by exactly one consumer (rename from ready/)
    done/       acknowledged after the step (then truncated to 0 bytes)
    rejected/   violated the [model] contract (+ <frame>.reason); never acknowledged
    producers/<producer>.done   {"frames": n}: no more frames from it
    weights.safetensors         the target's embedding and LM head (first publisher wins)

SpoolSource is the consumer the reference drafter uses (`--source spool`);
SpoolProducer lets a Python target publish frames the builtin drafter reads.
Under dflash-launch both come from the environment alone:
`SpoolProducer.from_env(contract)` in every process of a role with
`spool = "produce"`, `SpoolSource.from_env(contract)` in the drafters.
Frames are safetensors files; their metadata carries the contract (format,
layer_ids, hidden, layout, dtype, target_layers, vocab, producer, seq), and a
consumer checks it, with the tensors' dtypes and shapes, before any compute;
a producer checks the same before it publishes.

In a warm-up (DFLASH_WARMUP=1: gate mode "warmup", `dflash-launch seed`) both
stay off the spool: a source yields synthetic frames of [model] (the shapes
and dtypes of real ones, so the same graphs compile), a producer checks and
discards what it publishes. A warm-up that has not said READY after
WARMUP_FRAMES frames is stopped (exit 0: those steps compiled what the role
needs) with a message that names notify_ready() and is_warmup().

A FrameContractError that nobody catches ends the process with 65, which the
supervisor never restarts (a restart meets the same frame, or publishes the
same shapes).
"""

import ctypes
import errno
import json
import os
import stat
import struct
import sys
import time

from dflash_launch import HiddenStateContractError, check_hidden_shape, shape_string  # noqa: F401 (re-exported)
from dflash_launch._extras import require

FORMAT = "dflash-frame/1"
WEIGHTS_FORMAT = "dflash-weights/1"
EXT = ".safetensors"
#: A consumer that meets a frame violating the contract exits with this (EX_DATAERR): common/exit_codes.h's
#: kFrameContract (tests/test_exit_codes.py checks they agree).
EXIT_FRAME_CONTRACT = 65

_ST_DTYPES = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
#: Frames a warm-up gets (or publishes) before it is stopped if it has not said READY: a first compiled step
#: needs one; the second is what compiles on step 2 (an optimizer's state, a recompile on a new stride).
WARMUP_FRAMES = 2


class SpoolError(RuntimeError):
    """The spool itself is broken (I/O, a frame acknowledged twice)."""


class FrameContractError(HiddenStateContractError):
    """A frame that does not match [model]. `str(e)` names the frame, its
    producer, what was expected, what was found and the fix; the same text
    the builtin C++ consumer prints."""

    exit_code = EXIT_FRAME_CONTRACT

    def __init__(self, frame, producer, what, expected, found, fix):
        self.frame, self.producer, self.what = frame, producer, what
        self.expected, self.found, self.fix = expected, found, fix
        super().__init__(f"frame {frame} from producer {producer} does not match [model]: {what}\n"
                         f"  expected: {expected}\n  found:    {found}\n  fix (in producer {producer}): {fix}")


def _exit_on_contract_error():
    """Makes an uncaught FrameContractError end the process with its exit code
    (65) instead of Python's 1, which a restart policy would retry until its
    budget ran out. The traceback is printed first; the exit skips atexit
    handlers (the process is failing anyway, and the code must survive them)."""
    if getattr(sys.excepthook, "dflash_contract_exit", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        if isinstance(value, FrameContractError):
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(value.exit_code)

    hook.dflash_contract_exit = True
    sys.excepthook = hook


def _in_warmup(warmup):
    return os.environ.get("DFLASH_WARMUP") == "1" if warmup is None else bool(warmup)


def _warmup_spent(who, n, what):
    """The end of a warm-up's budget: stop it, saying why if it never said READY."""
    from dflash_launch import notify_status, said_ready

    if not said_ready():
        print(f"{who}: warm-up stopped after {n} {what} without saying READY. A warm-up "
              "(DFLASH_WARMUP=1) only compiles: the spool gives it synthetic frames of [model], never real ones, and "
              "takes nothing it publishes. Call dflash_launch.notify_ready() after the first compiled step (the "
              "warm-up then ends at once), and use dflash_launch.is_warmup() to skip what a warm-up need not do "
              "(checkpoints, evaluation); see docs/builtin.md, \"What a warm-up sees\".", file=sys.stderr, flush=True)
        notify_status(f"warm-up stopped after {n} frames without READY (call dflash_launch.notify_ready())")
    raise SystemExit(0)


_TORCH_TO_ST = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.int64": "I64",
                "torch.int32": "I32", "torch.float64": "F64"}


def _st_dtype(t):
    return _TORCH_TO_ST.get(str(t.dtype), str(t.dtype))


def _synthetic_frame(torch, contract, g):
    c = contract
    b, s, width = c["batch"], c["seq_len"], len(c["tapped_layers"]) * c["hidden"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(c["dtype"], torch.float32)
    hidden = torch.randn(b, s, width, generator=g).to(dtype)
    # Never vocab-1, the drafters' mask token (neither do the builtin target's ids).
    return hidden, torch.randint(0, max(1, c["vocab"] - 1), (b, s), generator=g, dtype=torch.long)


def frame_file(producer, seq):
    return f"{producer}-{int(seq):010d}{EXT}"


def parse_frame_file(name):
    """(producer, seq) of a frame file name, or None for anything else."""
    if not name.endswith(EXT):
        return None
    stem = name[:-len(EXT)]
    producer, dash, seq = stem.rpartition("-")
    if not dash or not producer or not seq.isdigit():
        return None
    return producer, int(seq)


# The contract check is dflash_launch.check_hidden_shape (the words of contract/shape_contract.cc, pinned by
# tests/fixtures/shape_errors.json for both languages); frame checks below add frame_contract.cc's words.


def _ints(text):
    try:
        return [int(x) for x in text.split(",")] if text else []
    except ValueError:
        return None


def check_frame(contract, metadata, tensors, frame):
    """Raises FrameContractError unless a frame's metadata and tensors (name ->
    (safetensors dtype, shape)) match the contract (contract_from_env())."""
    c, m = contract, metadata or {}
    producer = m.get("producer") or "(unnamed)"
    taps, hidden = list(c["tapped_layers"]), c["hidden"]
    b, s, n = c["batch"], c["seq_len"], len(taps)

    def fail(*args):
        raise FrameContractError(frame, producer, *args)

    if m.get("format") != FORMAT:
        fail("not a dflash hidden-state frame", f'metadata format = "{FORMAT}"', f'format = "{m.get("format", "")}"',
             "publish with dflash_launch.spool.SpoolProducer or the builtin target")
    if _ints(m.get("layer_ids", "")) != taps:
        want = shape_string(taps)
        fail("tapped layers differ from [model] tapped_layers",
             f"layer ids {want} (id i = output of layer i = HF hidden_states[i+1])",
             f"layer ids [{m.get('layer_ids', '')}]",
             f"tap exactly {want}, concatenated in that order; or, if the producer is right, set "
             f"[model] tapped_layers to its list (every drafter must read the same taps)")
    if m.get("hidden") != str(hidden):
        fail("hidden size differs from [model] hidden", f"hidden = {hidden}", f"hidden = {m.get('hidden', '')}",
             "publish the hidden states of the target [model] describes")
    if "hidden" not in tensors:
        fail('no "hidden" tensor', f'tensors "hidden" {shape_string([b, s, n * hidden])} and "tokens"',
             'no "hidden"', 'publish the concatenated taps as "hidden"')
    h_dtype, h_shape = tensors["hidden"]
    if m.get("layout") != "concat":
        _, expected, _, fix = check_hidden_shape(b, s, n, hidden, [b, s, n, hidden])
        fail("taps stacked on a new axis: the drafter's fc reads them concatenated", expected,
             f'layout = "{m.get("layout", "")}", shape {shape_string(h_shape)}', fix)
    v = check_hidden_shape(b, s, n, hidden, h_shape)
    if v:
        fail(*v)
    want_dtype = _ST_DTYPES.get(c["dtype"], "F32")
    if h_dtype != want_dtype or m.get("dtype") != c["dtype"]:
        fail("dtype differs from [model] dtype", f'{want_dtype} (dtype = "{c["dtype"]}")',
             f'{h_dtype} (metadata dtype = "{m.get("dtype", "")}")',
             f"cast the hidden states to {c['dtype']} before publishing, or set [model] dtype")
    tok = tensors.get("tokens")
    if tok is None or tok[0] != "I64" or list(tok[1]) != [b, s]:
        fail("token ids missing or misshapen", f'"tokens" I64 {shape_string([b, s])}',
             f'"tokens" {tok[0]} {shape_string(tok[1])}' if tok else 'no "tokens"',
             "publish the token ids of each sample with its hidden states, as int64 [batch, seq_len]")


def parse_header(data):
    """(metadata, {name: (dtype, shape)}) of safetensors bytes."""
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"not a safetensors file: header length {n} does not fit in {len(data)} bytes")
    header = json.loads(bytes(data[8:8 + n]))
    meta = header.pop("__metadata__", {}) or {}
    return meta, {k: (v["dtype"], v["shape"]) for k, v in header.items()}


# --- the directories ------------------------------------------------------------

def _rename_noreplace(src, dst):
    """rename(2) with RENAME_NOREPLACE (glibc renameat2); link+unlink where unsupported."""
    libc = _libc()
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


def _libc():
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


def _create_private(path):
    """A file of ours, 0600, never through a link."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb")


class Paths:
    def __init__(self, root):
        self.root = str(root)
        for d in ("tmp", "ready", "claimed", "done", "rejected", "producers"):
            setattr(self, d, os.path.join(self.root, d))
        self.weights = os.path.join(self.root, "weights.safetensors")

    def claimed_by(self, consumer):
        return os.path.join(self.claimed, consumer)

    def create(self):
        private_makedirs(self.root)
        for d in (self.tmp, self.ready, self.claimed, self.done, self.rejected, self.producers):
            private_makedirs(d)


def _frames(d):
    try:
        return [f for f in os.listdir(d) if parse_frame_file(f)]
    except FileNotFoundError:
        return []


def _atomic_write(path, text):
    tmp = f"{path}.tmp.{os.getpid()}"
    with _create_private(tmp) as f:
        f.write(text.encode())
    os.replace(tmp, path)


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
    ready = _frames(p.ready)
    claimed = sum(len(_frames(p.claimed_by(c))) for c in (os.listdir(p.claimed) if os.path.isdir(p.claimed) else []))
    done = {}
    for f in _frames(p.done):
        prod, seq = parse_frame_file(f)
        done.setdefault(prod, set()).add(seq)
        published.setdefault(prod, -1)
    rejected = sorted(_frames(p.rejected))
    per, tot_pub, tot_done, miss_tot, unexp_tot = {}, 0, 0, 0, 0
    for prod in sorted(published):
        n, seqs = published[prod], done.get(prod, set())
        missing = [s for s in range(n) if s not in seqs] if n >= 0 else []
        unexpected = [s for s in sorted(seqs) if s >= n] if n >= 0 else []
        per[prod] = {"published": n if n >= 0 else None, "consumed": len(seqs),
                     "first_seq": min(seqs) if seqs else None, "last_seq": max(seqs) if seqs else None,
                     "missing": len(missing), "missing_seqs": missing[:20],
                     "unexpected": len(unexpected), "unexpected_seqs": unexpected[:20]}
        tot_pub += max(0, n)
        tot_done += len(seqs)
        miss_tot += len(missing)
        unexp_tot += len(unexpected)
    finished = sum(1 for n in published.values() if n >= 0)
    final = producers > 0 and finished >= producers and not ready and claimed == 0
    return {"format": "dflash-spool/1", "final": final, "producers_expected": producers,
            "producers_finished": finished, "frames_published": tot_pub, "frames_consumed": tot_done,
            "ready": len(ready), "claimed": claimed, "rejected": rejected,
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
    if producers <= 0 or finished < producers or _frames(p.ready):
        return False
    m, final = manifest(root, producers)
    if final:
        _atomic_write(path, json.dumps(m, indent=2) + "\n")
    return final


def _manifest_path(root, env=None):
    env = os.environ if env is None else env
    run_dir = env.get("DFLASH_RUN_DIR")
    return os.path.join(run_dir, "spool.json") if run_dir else os.path.join(str(root), "spool.json")


class _Claimed:
    __slots__ = ("file", "path", "producer", "seq", "taken_back")

    def __init__(self, file, path, taken_back):
        self.file, self.path, self.taken_back = file, path, taken_back
        self.producer, self.seq = parse_frame_file(file)


class SpoolSource:
    """A consumer of the spool: yields {"hidden", "tokens", "seq", "producer",
    "frame", "taken_back", "ack"} per frame; call sample["ack"]() after the
    step. It first takes back what an earlier attempt of this consumer (same
    name) claimed and never acknowledged; it ends when every producer has
    finished and nothing is left to claim. A frame that violates the contract
    goes to rejected/ and raises FrameContractError (exit 65 in the drafter)."""

    def __init__(self, root, name, contract, producers=0, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES):
        """`producers`: how many producers will mark their end; `manifest_path`:
        default $DFLASH_RUN_DIR/spool.json (the spool dir is deleted after the
        run). `warmup` (default: DFLASH_WARMUP=1): synthetic frames only."""
        self.paths, self.name, self.contract, self.producers = Paths(root), name, contract, int(producers)
        self.manifest_path = manifest_path or _manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = _in_warmup(warmup), max(1, int(warmup_frames))
        self.taken_back = self.acked = self.synthetic = 0
        self.waited_s = 0.0
        self.manifest_written = False
        self._take_back, self._synth = [], None
        _exit_on_contract_error()
        if self.warmup:
            return  # a warm-up never touches the spool: no claim dir, nothing taken back
        self.paths.create()
        self.mine = self.paths.claimed_by(name)
        private_makedirs(self.mine)
        self._take_back = sorted(_frames(self.mine), key=lambda f: parse_frame_file(f)[::-1])

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, its producer count and manifest path, all from what
        dflash-launch sets (DFLASH_SPOOL_DIR, DFLASH_SPOOL_PRODUCERS, DFLASH_RUN_DIR;
        `name` defaults to DFLASH_PROCESS)."""
        env = os.environ if env is None else env
        root = env.get("DFLASH_SPOOL_DIR")
        if not root:
            raise SpoolError("DFLASH_SPOOL_DIR is not set: the spool directory frames come through "
                             "(dflash-launch sets it to <[run] spool_dir>/<run_id>)")
        producers = int(env.get("DFLASH_SPOOL_PRODUCERS", "0") or 0)
        warmup = env.get("DFLASH_WARMUP") == "1"
        if producers <= 0 and not warmup:
            raise SpoolError("DFLASH_SPOOL_PRODUCERS is 0: no role of this run says it publishes frames, so this "
                             "source could never end. Set spool = \"produce\" on the target role in run.toml "
                             "(builtin targets imply it); see docs/builtin.md")
        return cls(root, name or env.get("DFLASH_PROCESS", "drafter"), contract, producers,
                   _manifest_path(root, env), warmup=warmup, **kwargs)

    def shared_weights(self, say=print):
        """The target's embedding and LM head ({"embed.weight", "lm_head.weight"},
        float32), waiting for the first target to publish them. A warm-up gets
        random ones of the same shape at once (it compiles; its results go)."""
        if self.warmup:
            torch = require("torch", "the spool's shared weights")
            g = torch.Generator().manual_seed(0)
            shape = (self.contract["vocab"], self.contract["hidden"])
            return {k: torch.randn(*shape, generator=g) * 0.02 for k in ("embed.weight", "lm_head.weight")}
        load = require("safetensors.torch", "the spool's shared weights").load

        t0, next_say, delay = time.monotonic(), time.monotonic() + 5, 1e-3
        while not os.path.exists(self.paths.weights):
            if time.monotonic() >= next_say:
                say(f"{self.name}: waiting for {self.paths.weights} from the targets ({time.monotonic() - t0:.0f}s)")
                next_say += 60
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        with open(self.paths.weights, "rb") as f:
            data = f.read()
        meta, _ = parse_header(data)
        w = load(data)
        vocab, hidden = self.contract["vocab"], self.contract["hidden"]
        for k in ("embed.weight", "lm_head.weight"):
            got = list(w[k].shape) if k in w else None
            if got != [vocab, hidden]:
                raise FrameContractError(
                    "weights.safetensors", meta.get("producer", "(unnamed)"), f"{k} does not fit [model]",
                    f"{k} [{vocab}, {hidden}] (vocab x hidden)", f"{k} {got}",
                    "publish the embedding and LM head of the target [model] describes")
        return {k: w[k] for k in ("embed.weight", "lm_head.weight")}

    def stats(self):
        return {"taken_back": self.taken_back, "frames_acked": self.acked, "spool_wait_s": round(self.waited_s, 3),
                "manifest_written": self.manifest_written, "warmup": self.warmup, "synthetic_frames": self.synthetic}

    # The protocol ------------------------------------------------------------

    def _producers_done(self):
        if self.producers <= 0:
            return False
        try:
            return sum(f.endswith(".done") for f in os.listdir(self.paths.producers)) >= self.producers
        except FileNotFoundError:
            return False

    def _next(self):
        if self._take_back:
            self.taken_back += 1
            f = self._take_back.pop(0)
            return _Claimed(f, os.path.join(self.mine, f), True)
        t0, delay, waited = time.monotonic(), 1e-4, False
        while True:
            cands = sorted((parse_frame_file(f)[::-1], f) for f in _frames(self.paths.ready))
            for _, f in cands:
                dst = os.path.join(self.mine, f)
                try:
                    os.rename(os.path.join(self.paths.ready, f), dst)  # the claim: one rename wins
                except FileNotFoundError:
                    continue
                if waited:
                    self.waited_s += time.monotonic() - t0
                return _Claimed(f, dst, False)
            if cands:
                continue
            if self._producers_done() and not _frames(self.paths.ready):
                if waited:
                    self.waited_s += time.monotonic() - t0
                return None
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def reject(self, claimed, reason):
        dst = os.path.join(self.paths.rejected, claimed.file)
        _atomic_write(dst + ".reason", reason + "\n")
        os.rename(claimed.path, dst)

    def ack(self, claimed):
        dst = os.path.join(self.paths.done, claimed.file)
        try:
            _rename_noreplace(claimed.path, dst)
        except FileExistsError:
            raise SpoolError(f"frame {claimed.file} was acknowledged before (done/ has it): producer "
                             f"{claimed.producer} published sequence number {claimed.seq} twice") from None
        os.truncate(dst, 0)  # the name is the record; the bytes can go
        self.acked += 1
        self.write_manifest_if_final()

    def write_manifest_if_final(self):
        """Whoever acknowledges the last frame writes the manifest (every
        consumer that sees the final state writes the same content)."""
        if self.warmup:
            return False
        if write_manifest_if_final(self.paths.root, self.producers, self.manifest_path):
            self.manifest_written = True
            return True
        return False

    def _synthetic(self, torch):
        g = torch.Generator().manual_seed(int(self.contract.get("seed", 0)))
        while True:
            if self.synthetic >= self.warmup_frames:
                _warmup_spent(self.name, self.synthetic, "synthetic frames from the spool")
            hidden, tokens = _synthetic_frame(torch, self.contract, g)
            self.synthetic += 1
            yield {"hidden": hidden, "tokens": tokens, "seq": self.synthetic - 1, "producer": "(warm-up)",
                   "frame": None, "taken_back": False, "synthetic": True, "ack": lambda: None}

    def next_sample(self):
        """The next frame as a sample dict, or None once the spool has ended (every producer finished, nothing
        left to claim). A frame that violates [model] goes to rejected/ and raises FrameContractError.
        What iterating the source calls; dflash_launch.spool_world.WorldSource calls it once per round."""
        torch = require("torch", "reading spool frames as tensors")
        if self.warmup:
            if self._synth is None:
                self._synth = self._synthetic(torch)
            return next(self._synth)
        load = require("safetensors.torch", "reading spool frames as tensors").load
        c = self._next()
        if c is None:
            self.write_manifest_if_final()
            return None
        with open(c.path, "rb") as f:
            data = f.read()
        try:
            try:
                meta, tensors = parse_header(data)
            except (ValueError, KeyError) as e:
                raise FrameContractError(c.file, c.producer, "not a safetensors frame", "a safetensors file",
                                         str(e), "publish with SpoolProducer or the builtin target") from None
            # The contract, before any compute.
            check_frame(self.contract, meta, tensors, c.file)
            t = load(data)
            tokens, hidden = t["tokens"], t["hidden"]
            bad = (tokens < 0) | (tokens >= self.contract["vocab"])
            if bool(bad.any()):
                i = int(bad.flatten().nonzero()[0])
                raise FrameContractError(c.file, meta.get("producer") or "(unnamed)", "token id out of range",
                                         f"ids in [0, {self.contract['vocab']})",
                                         f"id {int(tokens.flatten()[i])} at position {i}",
                                         "publish ids of the target's vocabulary, or set [model] vocab")
        except FrameContractError as e:
            self.reject(c, str(e))
            raise
        return {"hidden": hidden, "tokens": tokens.to(torch.long), "seq": c.seq, "producer": c.producer,
                "frame": c.file, "taken_back": c.taken_back, "ack": (lambda c=c: self.ack(c))}

    def __iter__(self):
        while True:
            sample = self.next_sample()
            if sample is None:
                return
            yield sample


def frame_bytes(hidden, tokens, metadata):
    """A frame as safetensors bytes (no checks: see SpoolProducer.publish)."""
    save = require("safetensors.torch", "writing spool frames").save

    return save({"hidden": hidden.contiguous(), "tokens": tokens.contiguous()},
                metadata={k: str(v) for k, v in metadata.items()})


def frame_metadata(contract):
    """The contract part of a frame's metadata (producer and seq are added at publish)."""
    c = contract
    return {"format": FORMAT, "layer_ids": ",".join(str(i) for i in c["tapped_layers"]), "hidden": str(c["hidden"]),
            "layout": "concat", "dtype": c["dtype"], "target_layers": str(c["target_layers"]),
            "vocab": str(c["vocab"])}


class SpoolProducer:
    """Publishes frames for the drafters (a Python target). Resumes after its
    highest sequence number in the spool and removes its half-written temp
    files; waits while ready/ holds `max_ready` frames. In a warm-up it checks
    and discards what it publishes."""

    def __init__(self, root, name, contract, max_ready=16, producers=None, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES):
        """`producers` (default $DFLASH_SPOOL_PRODUCERS) and `manifest_path`
        (default $DFLASH_RUN_DIR/spool.json): for the manifest at finish()."""
        self.paths, self.name, self.contract, self.max_ready = Paths(root), name, contract, max(1, int(max_ready))
        self.producers = int(os.environ.get("DFLASH_SPOOL_PRODUCERS", "0") or 0) if producers is None else producers
        self.manifest_path = manifest_path or _manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = _in_warmup(warmup), max(1, int(warmup_frames))
        self.discarded = 0
        _exit_on_contract_error()
        if self.warmup:
            self.next_seq, self.finished = 0, False
            return  # a warm-up publishes nothing: the drafters' frames come from the real targets
        self.paths.create()
        for f in os.listdir(self.paths.tmp):
            pf = parse_frame_file(f[:-4]) if f.endswith(".tmp") else None
            if (pf and pf[0] == name) or f.endswith(f"@{name}.tmp"):
                os.unlink(os.path.join(self.paths.tmp, f))
        dirs = [self.paths.ready] + [self.paths.claimed_by(c) for c in os.listdir(self.paths.claimed)]
        dirs += [self.paths.done, self.paths.rejected]
        seqs = [s for d in dirs for p, s in map(parse_frame_file, _frames(d)) if p == name]
        self.next_seq = max(seqs, default=-1) + 1
        self.finished = os.path.exists(os.path.join(self.paths.producers, f"{name}.done"))

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, producer count and manifest path from what dflash-launch
        sets; `name` defaults to DFLASH_PROCESS ("target:0")."""
        env = os.environ if env is None else env
        root = env.get("DFLASH_SPOOL_DIR")
        if not root:
            raise SpoolError("DFLASH_SPOOL_DIR is not set: the spool directory frames go through "
                             "(dflash-launch sets it to <[run] spool_dir>/<run_id>)")
        return cls(root, name or env.get("DFLASH_PROCESS", "target"), contract,
                   producers=int(env.get("DFLASH_SPOOL_PRODUCERS", "0") or 0), manifest_path=_manifest_path(root, env),
                   warmup=env.get("DFLASH_WARMUP") == "1", **kwargs)

    def check(self, hidden, tokens, metadata, seq):
        """Raises FrameContractError unless the frame matches [model]: the
        consumers' own check (check_frame), at the producer's end."""
        f = frame_file(self.name, seq)
        check_frame(self.contract, metadata, {"hidden": (_st_dtype(hidden), list(hidden.shape)),
                                              "tokens": (_st_dtype(tokens), list(tokens.shape))}, f)
        vocab = self.contract["vocab"]
        bad = (tokens < 0) | (tokens >= vocab)
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise FrameContractError(f, self.name, "token id out of range", f"ids in [0, {vocab})",
                                     f"id {int(tokens.flatten()[i])} at position {i}",
                                     "publish ids of the target's vocabulary, or set [model] vocab")

    def publish(self, hidden, tokens, metadata=None, check=True):
        """Publishes one sample; returns its sequence number. Checks the
        contract first (the producer's end of it: FrameContractError, exit 65
        when uncaught) unless check=False. Integer token ids become int64."""
        c = self.contract
        if not tokens.is_floating_point() and str(tokens.dtype) != "torch.int64":
            tokens = tokens.long()
        seq = self.next_seq
        meta = dict(frame_metadata(c), **(metadata or {}), producer=self.name, seq=str(seq))
        if check:
            self.check(hidden, tokens, meta, seq)
        if self.warmup:
            if self.discarded >= self.warmup_frames:
                _warmup_spent(self.name, self.discarded, "frames published (and discarded)")
            self.discarded += 1
            return seq
        delay = 1e-4
        while len(_frames(self.paths.ready)) >= self.max_ready:
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        f = frame_file(self.name, seq)
        tmp = os.path.join(self.paths.tmp, f + ".tmp")
        with _create_private(tmp) as out:
            out.write(frame_bytes(hidden, tokens, meta))
        _rename_noreplace(tmp, os.path.join(self.paths.ready, f))
        self.next_seq = seq + 1
        return seq

    def publish_weights(self, embed, lm_head):
        """Publishes the target's embedding and LM head ([vocab, hidden] each) for
        the drafters, once per spool: the first publisher wins. True if we did."""
        save = require("safetensors.torch", "publishing the shared weights").save

        if self.warmup or os.path.exists(self.paths.weights):
            return False
        data = save({"embed.weight": embed.detach().float().contiguous(),
                     "lm_head.weight": lm_head.detach().float().contiguous()},
                    metadata={"format": WEIGHTS_FORMAT, "producer": self.name})
        tmp = os.path.join(self.paths.tmp, f"weights.safetensors@{self.name}.tmp")
        with _create_private(tmp) as out:
            out.write(data)
        try:
            _rename_noreplace(tmp, self.paths.weights)
            return True
        except FileExistsError:
            os.unlink(tmp)
            return False

    def finish(self):
        """The end marker; then, if the drafters already acknowledged every
        frame, the manifest (`producers` producers are expected)."""
        if self.warmup:
            return
        _atomic_write(os.path.join(self.paths.producers, f"{self.name}.done"),
                      json.dumps({"producer": self.name, "frames": self.next_seq}) + "\n")
        self.finished = True
        write_manifest_if_final(self.paths.root, self.producers, self.manifest_path)

"""The spool's consumer: SpoolSource claims frames, checks them against [model] and acknowledges them after the step
(what the reference drafter reads); every state move is libdflash_spool.so's (_native)."""

import json
import os
import time

from dflash_launch._extras import require
from dflash_launch.exit_codes import use_exit_codes
from dflash_launch.spool import _native
from dflash_launch.spool.dirs import Paths, default_manifest_path, default_max_bytes, spool_root_from_env
from dflash_launch.spool.format import FrameContractError, SpoolError, check_frame, parse_header
from dflash_launch.spool.mapped import MappedFrame, Released
from dflash_launch.spool.warmup import WARMUP_FRAMES, in_warmup, synthetic_frame, warmup_spent

#: A claim waits at most this long inside the library: between waits signal handlers run (Checkpoint's SIGTERM).
WAIT_S = 0.05


class _Claimed:
    def __init__(self, frame):
        self.frame, self.file, self.path = frame, frame.file.decode(), frame.path.decode()
        self.producer, self.seq, self.taken_back = frame.producer.decode(), frame.seq, bool(frame.taken_back)
        self.mapped = self.position = None


class SpoolSource:
    """A consumer of the spool: yields {"hidden", "tokens", "seq", "producer", "frame", "taken_back", "ack"} per
    frame; call sample["ack"]() after the step. It first takes back what an earlier attempt of this consumer (same
    name) claimed and never acknowledged; it ends when every producer has finished and nothing is left to claim. A
    frame that violates the contract or cannot be read as it says is quarantined in rejected/ with its reason and
    raises FrameContractError (exit 65).

    "hidden" and "tokens" are views of the frame's mapped pages (mapped.py: no copy; an in-place write copies the
    page for this process), valid for as long as the trainer keeps them: a frame's bytes go only after it is done
    and its last view is gone. pin=True page-locks each mapping for CUDA. With a checkpoint (hold_for_checkpoint())
    an acknowledged frame waits in pending/<name>/ until a checkpoint covering it commits; restore(position) delivers
    the pending frames after it again, in order. set_order() (WorldSource) deals the spool's fixed order instead."""

    def __init__(self, root, name, contract, producers=0, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES, pin=False):
        """`producers`: how many producers will mark their end; `manifest_path`: default $DFLASH_RUN_DIR/spool.json.
        `warmup` (default: DFLASH_WARMUP=1): synthetic frames only."""
        self.paths, self.name, self.contract, self.producers = Paths(root), name, contract, int(producers)
        self.pin, self.pinned = bool(pin), 0
        self.manifest_path = manifest_path or default_manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = in_warmup(warmup), max(1, int(warmup_frames))
        self.acked = self.synthetic = self.committed = self.taken_back = 0
        self.waited_s = 0.0
        self.position = 0            # samples handed out: what a checkpoint records and restore() goes back to
        self.hold = self.ordered = self.manifest_written = False
        self._synth, self._h = None, None
        if self.warmup:
            return  # a warm-up never touches the spool: no claim dir, nothing taken back
        h = _native.c_void_p()
        _native.call("dfs_consumer_open", _native.fs(root), name.encode(), self.producers, _native.byref(h))
        self._h, self._lib = h, _native.lib()
        # The ring's mappings are kept for the frames written over their files; not pinned ones, nor with the ring off.
        keep = not self.pin and os.environ.get("DFLASH_SPOOL_RING", "1") != "0"
        self._released = Released(h, require("torch", "reading spool frames as tensors") if pin else None, keep)

    def __del__(self):
        if getattr(self, "_h", None):
            self._released.flush()
            self._lib.dfs_consumer_close(self._h)
            self._h = None

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, producer count and manifest path from what dflash-launch sets; `name`: DFLASH_PROCESS."""
        use_exit_codes()  # a payload of dflash-launch: an uncaught FrameContractError ends it with 65
        env = os.environ if env is None else env
        root = spool_root_from_env(env)
        producers = int(env.get("DFLASH_SPOOL_PRODUCERS", "0") or 0)
        warmup = env.get("DFLASH_WARMUP") == "1"
        if producers <= 0 and not warmup:
            raise SpoolError("DFLASH_SPOOL_PRODUCERS is 0: no role of this run says it publishes frames, so this "
                             "source could never end. Set spool = \"produce\" on the target role in run.toml "
                             "(builtin targets imply it); see docs/builtin.md")
        return cls(root, name or env.get("DFLASH_PROCESS", "drafter"), contract, producers,
                   default_manifest_path(root, env), warmup=warmup, **kwargs)

    def shared_weights(self, say=print):
        """The target's embedding and LM head ({"embed.weight", "lm_head.weight"}, float32), waiting for the first
        target to publish them; a warm-up gets random ones of the same shape at once."""
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
        name = os.path.basename(self.paths.weights)
        try:
            meta, _ = parse_header(data)
            w = load(data)
        except Exception as e:  # noqa: BLE001 -- whatever fails to read them, they are the producer's fault: 65
            raise FrameContractError(name, "(unknown)", "the shared weights cannot be read",
                                     "a safetensors file of embed.weight and lm_head.weight", f"{type(e).__name__}: {e}",
                                     "publish them with SpoolProducer.publish_weights or the builtin target") from None
        vocab, hidden = self.contract["vocab"], self.contract["hidden"]
        for k in ("embed.weight", "lm_head.weight"):
            got = list(w[k].shape) if k in w else None
            if got != [vocab, hidden]:
                raise FrameContractError(
                    name, meta.get("producer", "(unnamed)"), f"{k} does not fit [model]",
                    f"{k} [{vocab}, {hidden}] (vocab x hidden)", f"{k} {got}",
                    "publish the embedding and LM head of the target [model] describes")
        return {k: w[k] for k in ("embed.weight", "lm_head.weight")}

    def stats(self):
        return {"taken_back": self.taken_back, "frames_acked": self.acked, "frames_committed": self.committed,
                "mappings_reused": self._lib.dfs_map_hits(self._h) if self._h else 0,
                "spool_wait_s": round(self.waited_s, 3), "manifest_written": self.manifest_written,
                "warmup": self.warmup, "synthetic_frames": self.synthetic}

    def set_order(self, rank, world, start_round):
        """Frames in the spool's fixed order from now on: rank `rank` of `world` from round `start_round` (what
        WorldSource deals). Returns the quarantined frames it leaves out."""
        _native.call("dfs_consumer_set_order", self._h, int(rank), int(world), int(start_round))
        self.ordered = True
        return _native.call_json("dfs_consumer_order_skipped", self._h, 0)

    def order_skipped(self):
        """The quarantined frames the fixed order's walk has passed so far, in order."""
        return _native.call_json("dfs_consumer_order_skipped", self._h, 1) if self.ordered else []

    def _next(self):
        frame, t0 = _native.Frame(), None
        while True:
            r = _native.call("dfs_consumer_next", self._h, WAIT_S, _native.byref(frame))
            if r != _native.NOT_YET:
                break
            t0 = t0 or time.monotonic()
        if t0 is not None:
            self.waited_s += time.monotonic() - t0
        if r == _native.END:
            return None
        c = _Claimed(frame)
        self.taken_back += c.taken_back
        return c

    def hold_for_checkpoint(self):
        """From now on an acknowledged frame waits in pending/<name>/ for the checkpoint that covers it."""
        if not self.warmup:
            _native.call("dfs_consumer_hold_for_checkpoint", self._h)
            self.hold = True

    def pending_bytes(self):
        """The bytes of the frames this consumer acknowledged that wait in pending/ for a checkpoint."""
        out = _native.c_int64()
        _native.call("dfs_consumer_pending_bytes", self._h, _native.byref(out))
        return out.value

    def pending_level(self):
        """pending_bytes() over this consumer's share of the byte budget (split between the consumers that have
        claimed so far); 0 when frames do not wait for checkpoints. A Checkpoint takes one past 1."""
        if not self.hold:
            return 0.0
        n = _native.c_int32()
        _native.call("dfs_consumer_count", self._h, _native.byref(n))
        return self.pending_bytes() / max(1, default_max_bytes(self.paths.root) // max(1, n.value))

    def state_dict(self):
        return {"position": self.position, "consumer": self.name}  # whose position: a commit moves its frames

    @property
    def spool_root(self):
        return os.path.abspath(self.paths.root)

    def committed_records(self):
        return {} if self.warmup else _native.call_json("dfs_consumer_committed_records", self._h)

    def restore(self, state, positions=None, checkpoint=None):
        """Back to the position a checkpoint recorded (`state`: state_dict(); None: the start). With `checkpoint`
        the pending frames before the positions it recorded ({consumer: position}, default this consumer's) are
        committed first (a kill may have come before its commit); this consumer's pending frames after its position
        come again first, in order."""
        position = int(state["position"]) if state else 0
        if self.warmup:
            return
        n = _native.c_int32()
        _native.call("dfs_consumer_restore", self._h, position, json.dumps(positions).encode() if positions else b"",
                     str(checkpoint or "").encode(), _native.byref(n))
        self.committed += n.value
        self.position = position

    @staticmethod
    def position_of(state):
        return int(state["position"])

    def commit(self, positions, checkpoint):
        """The checkpoint at `checkpoint` committed, having recorded `positions` ({consumer: position}): the frames
        acknowledged before them are done, their record naming it (a frame a view maps is unlinked, never reused)."""
        if self.warmup:
            return 0
        self._released.sweep()  # the views gone since the last claim: their frames' bytes may go to the ring
        n = _native.c_int32()
        _native.call("dfs_consumer_commit", self._h, json.dumps(positions).encode(), str(checkpoint).encode(),
                     json.dumps(sorted(self._released.viewed())).encode(), _native.byref(n))
        self.committed += n.value
        self.write_manifest_if_final()
        return n.value

    # Stateful (dflash_launch.stateful): what a Checkpoint carries and tells; each delegates to the above.

    def load_state_dict(self, state):
        self.restore(state)

    def start_over(self):
        self.restore(None)

    def attached(self, finish):
        self.hold_for_checkpoint()  # a plain source has no end of its own to call `finish` at

    @property
    def identity(self):
        return self.spool_root

    metrics = None

    def step_ended(self):
        pass  # the loop acknowledges a plain source's frames itself

    def checkpoint_committed(self, states, checkpoint):
        self.commit({s["consumer"]: s["position"] for s in states if s}, checkpoint)

    def reject(self, claimed, reason):
        _native.call("dfs_consumer_reject", self._h, _native.byref(claimed.frame), reason.encode())
        if claimed.mapped is not None and not claimed.mapped.in_use():
            claimed.mapped.release(keep=False)
        claimed.mapped = None

    def ack(self, claimed):
        """After the step: done/ (its bytes go with its last view), or pending/ (kept for a replay)."""
        _native.call("dfs_consumer_ack", self._h, _native.byref(claimed.frame), claimed.position, 0)
        self._released.drop(claimed.mapped, None if self.hold else claimed.file)
        claimed.mapped = None
        self.acked += 1
        if not self.hold:
            self.write_manifest_if_final()

    def release(self):
        """Drops the bytes of the acknowledged frames no tensor maps any more, waiting for it; how many still wait
        for their last view (every claim and acknowledgement does the same without the wait)."""
        still = self._released.sweep()
        self._released.flush()
        return still

    def write_manifest_if_final(self):
        """Whoever acknowledges the last frame writes the manifest (all who see the final state write the same)."""
        if self.warmup:
            return False
        written = _native.c_int32()
        _native.call("dfs_consumer_write_manifest_if_final", self._h, _native.fs(self.manifest_path),
                     _native.byref(written))
        self.manifest_written |= bool(written.value)
        return bool(written.value)

    def _synthetic(self, torch):
        g = torch.Generator().manual_seed(int(self.contract.get("seed", 0)))
        while True:
            if self.synthetic >= self.warmup_frames:
                warmup_spent(self.name, self.synthetic, "synthetic frames from the spool")
            hidden, tokens = synthetic_frame(torch, self.contract, g)
            self.synthetic += 1
            yield {"hidden": hidden, "tokens": tokens, "seq": self.synthetic - 1, "producer": "(warm-up)",
                   "frame": None, "taken_back": False, "synthetic": True, "ack": lambda: None}

    def next_sample(self):
        """The next frame as a sample dict, or None once the spool has ended; a frame that violates [model] goes to
        rejected/ and raises FrameContractError. WorldSource calls it once per round."""
        torch = require("torch", "reading spool frames as tensors")
        if self.warmup:
            if self._synth is None:
                self._synth = self._synthetic(torch)
            return next(self._synth)
        self._released.sweep()
        c = self._next()
        if c is None:
            self._released.flush()
            self.write_manifest_if_final()
            return None
        try:
            hidden, tokens = self._read(torch, c)
        except FrameContractError as e:
            self.reject(c, str(e))
            raise
        except (OSError, SpoolError):
            raise  # the spool's files, not the frame: a restartable failure
        except Exception as e:  # noqa: BLE001 -- any other failure to read it is the frame's: quarantined, 65
            err = FrameContractError(c.file, c.producer, "not a frame the contract can read",
                                     "a safetensors file of \"hidden\" and \"tokens\" with a metadata object",
                                     f"{type(e).__name__}: {e}",
                                     "publish with dflash_launch.spool.SpoolProducer or the builtin target; the frame "
                                     f"is quarantined in {self.paths.rejected}")
            self.reject(c, str(err))
            raise err from None
        c.position = self.position
        self.position += 1
        return {"hidden": hidden, "tokens": tokens.to(torch.long), "seq": c.seq, "producer": c.producer,
                "frame": c.file, "taken_back": c.taken_back, "ack": (lambda c=c: self.ack(c))}

    def _read(self, torch, c):
        """(hidden, tokens) of claimed frame `c`: views of its mapping, checked against [model] before any compute."""
        c.mapped = m = MappedFrame(self._h, c.path)
        meta = m.meta
        check_frame(self.contract, meta, {k: (v[0], v[1]) for k, v in m.layout.items()}, c.file)
        tokens, hidden = m.tensor(torch, "tokens"), m.tensor(torch, "hidden")
        bad = (tokens < 0) | (tokens >= self.contract["vocab"])
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            raise FrameContractError(c.file, meta.get("producer") or "(unnamed)", "token id out of range",
                                     f"ids in [0, {self.contract['vocab']})",
                                     f"id {int(tokens.flatten()[i])} at position {i}",
                                     "publish ids of the target's vocabulary, or set [model] vocab")
        if self.pin and m.pin(torch):
            self.pinned += 1
        return hidden, tokens

    def __iter__(self):
        return iter(self.next_sample, None)

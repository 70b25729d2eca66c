"""The spool's consumer: SpoolSource claims frames, checks them against [model]
and acknowledges them after the step (what the reference drafter reads)."""

import os
import time

from dflash_launch._extras import require
from dflash_launch.exit_codes import use_exit_codes
from dflash_launch.spool.dirs import (Paths, atomic_write, frame_names, default_manifest_path, rename_noreplace,
                                      commit_pending, committed_records, pending_frames, pending_name,
                                      private_makedirs, write_manifest_if_final, entries, spool_root_from_env)
from dflash_launch.spool.format import (FrameContractError, SpoolError, check_frame,
                                        frame_file, parse_frame_file, parse_header)
from dflash_launch.spool import ring
from dflash_launch.spool.mapped import MapCache, MappedFrame, Released
from dflash_launch.spool.warmup import WARMUP_FRAMES, in_warmup, synthetic_frame, warmup_spent
from dflash_launch.spool.write import default_max_bytes


class _Claimed:
    __slots__ = ("file", "path", "producer", "seq", "taken_back", "mapped", "position")

    def __init__(self, file, path, taken_back):
        self.file, self.path, self.taken_back, self.mapped = file, path, taken_back, None
        self.producer, self.seq = parse_frame_file(file)
        self.position = None


class SpoolSource:
    """A consumer of the spool: yields {"hidden", "tokens", "seq", "producer",
    "frame", "taken_back", "ack"} per frame; call sample["ack"]() after the
    step. It first takes back what an earlier attempt of this consumer (same
    name) claimed and never acknowledged; it ends when every producer has
    finished and nothing is left to claim. A frame that violates the contract,
    or cannot be read as the contract says (any parse error), is quarantined in
    rejected/ with its reason and raises FrameContractError (exit 65).

    A sample's "hidden" and "tokens" are views of the frame's mapped pages
    (dflash_launch.spool.mapped: no copy; an in-place write copies the page for
    this process, never the spool's bytes). They stay valid for as long as the
    trainer keeps them: the frame's bytes are dropped only after it is done
    (acknowledged, or with a checkpoint committed) and its last view is gone.
    pin=True page-locks each mapping for CUDA (a non-blocking H2D copy of a
    view; nothing where CUDA is absent).

    With a checkpoint (dflash_launch.Checkpoint(..., source=...) calls
    hold_for_checkpoint()) an acknowledged frame stays pending
    (pending/<name>/) until a checkpoint that covers it commits
    (commit()); restore(position) delivers the pending frames after that
    position again, in their order. With `order` (a SpoolOrder: WorldSource
    sets one) it takes the frames that order names instead of the first it
    can claim."""

    def __init__(self, root, name, contract, producers=0, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES, pin=False):
        """`producers`: how many producers will mark their end; `manifest_path`:
        default $DFLASH_RUN_DIR/spool.json (the spool dir is deleted after the
        run). `warmup` (default: DFLASH_WARMUP=1): synthetic frames only."""
        self.paths, self.name, self.contract, self.producers = Paths(root), name, contract, int(producers)
        self.pin, self.pinned = bool(pin), 0
        # The ring (ring.py): acknowledged files go back to their producers, their mappings kept for the next
        # frames written over them; not for pinned mappings (a registration per frame is the point there).
        self._maps = None if self.pin or not ring.enabled() else MapCache()
        self._released = Released(require("torch", "reading spool frames as tensors") if pin else None,
                                  cache=self._maps, recycle=lambda path: ring.recycle(self.paths, path))
        self.manifest_path = manifest_path or default_manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = in_warmup(warmup), max(1, int(warmup_frames))
        self.taken_back = self.acked = self.synthetic = 0
        self.waited_s = 0.0
        self.position = 0            # samples handed out: what a checkpoint records and restore() goes back to
        self.hold = False            # acknowledged frames wait in pending/ for a checkpoint (hold_for_checkpoint)
        self.order = None            # a SpoolOrder: frames in a fixed order (WorldSource)
        self.committed = 0
        self._replay = {}            # frame -> its pending path, to deliver again after a restore
        self.manifest_written = False
        self._take_back, self._synth = [], None
        if self.warmup:
            return  # a warm-up never touches the spool: no claim dir, nothing taken back
        self.paths.create()
        ring.remove_leftovers(self.paths)
        self.mine = self.paths.claimed_by(name)
        private_makedirs(self.mine)
        self._take_back = sorted(frame_names(self.mine), key=lambda f: parse_frame_file(f)[::-1])

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, its producer count and manifest path, all from what
        dflash-launch sets (DFLASH_SPOOL_DIR, DFLASH_SPOOL_PRODUCERS, DFLASH_RUN_DIR;
        `name` defaults to DFLASH_PROCESS)."""
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
        try:
            meta, _ = parse_header(data)
            w = load(data)
        except Exception as e:  # noqa: BLE001 -- whatever fails to read them, they are the producer's fault: 65
            raise FrameContractError("weights.safetensors", "(unknown)", "the shared weights cannot be read",
                                     "a safetensors file of embed.weight and lm_head.weight", f"{type(e).__name__}: {e}",
                                     "publish them with SpoolProducer.publish_weights or the builtin target") from None
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
        return {"taken_back": self.taken_back, "frames_acked": self.acked, "frames_committed": self.committed,
                "mappings_reused": self._maps.hits if self._maps else 0,
                "spool_wait_s": round(self.waited_s + (self.order.waited_s if self.order else 0.0), 3),
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
        if self.order is not None:
            return self._next_in_order()
        if self._take_back:
            self.taken_back += 1
            f = self._take_back.pop(0)
            return _Claimed(f, self._replay.pop(f, None) or os.path.join(self.mine, f), True)
        t0, delay, waited = time.monotonic(), 1e-4, False
        while True:
            cands = sorted((parse_frame_file(f)[::-1], f) for f in frame_names(self.paths.ready))
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
            if self._producers_done() and not frame_names(self.paths.ready):
                if waited:
                    self.waited_s += time.monotonic() - t0
                return None
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _next_in_order(self):
        """The frame the order names next, wherever it is: pending here (delivered again after a restore),
        claimed here (taken back), ready (claimed now), held under another consumer's name (taken over)."""
        while True:
            entry = self.order.next()
            if entry is None:
                return None
            c = self._find(frame_file(*entry))
            if c is not None:
                return c

    def _find(self, f):
        """`f`, claimed by this consumer; None if an earlier attempt acknowledged it without a checkpoint."""
        if f in self._replay:
            self.taken_back += 1
            return _Claimed(f, self._replay.pop(f), True)
        mine = os.path.join(self.mine, f)
        t0, delay = time.monotonic(), 1e-4
        while True:
            if os.path.exists(mine):
                self.taken_back += 1
                return _Claimed(f, mine, True)
            try:
                os.rename(os.path.join(self.paths.ready, f), mine)
                return _Claimed(f, mine, False)
            except FileNotFoundError:
                pass
            for other in self._held_elsewhere(f):
                try:
                    os.rename(other, mine)
                except FileNotFoundError:
                    continue
                self.taken_back += 1
                return _Claimed(f, mine, True)
            if os.path.exists(os.path.join(self.paths.done, f)):
                if self.hold:
                    raise SpoolError(f"{self.name}: frame {f} is next in the order at position {self.position} but "
                                     f"done/ has it (a checkpoint committed it): the restored checkpoint and the "
                                     f"spool disagree (was the checkpoint dir changed, or a newer checkpoint "
                                     f"deleted?)")
                return None  # no checkpoint: acknowledged by an earlier attempt (at least once, as before)
            if os.path.exists(os.path.join(self.paths.rejected, f)):
                raise SpoolError(f"{self.name}: frame {f} is next in the order but was rejected (rejected/{f}.reason)")
            if time.monotonic() - t0 > 60:
                raise SpoolError(f"{self.name}: frame {f} is next in the order but is nowhere in the spool")
            time.sleep(delay)  # moving between directories as we looked: look again
            delay = min(delay * 2, 0.01)

    def _held_elsewhere(self, f):
        out = []
        for parent in (self.paths.claimed, self.paths.pending):
            for c in entries(parent):
                if c == self.name:
                    continue
                if parent == self.paths.claimed:
                    out.append(os.path.join(parent, c, f))
                else:
                    out += [path for _, frame, path in pending_frames(self.paths.root, c) if frame == f]
        return out

    # Commits with a checkpoint -------------------------------------------------

    def hold_for_checkpoint(self):
        """From now on an acknowledged frame waits in pending/<name>/ for the checkpoint that covers it."""
        if not self.warmup:
            self.hold = True
            private_makedirs(self.paths.pending_of(self.name))

    def pending_bytes(self):
        """The bytes of the frames this consumer acknowledged that wait in pending/ for a checkpoint."""
        total = 0
        try:
            with os.scandir(self.paths.pending_of(self.name)) as it:
                for e in it:
                    try:
                        total += e.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        pass  # committed meanwhile
        except FileNotFoundError:
            pass
        return total

    def pending_level(self):
        """pending_bytes() over this consumer's share of the spool's byte budget (the producers' budget,
        spool.write.default_max_bytes, split between the consumers that have claimed so far); 0 when frames do
        not wait for checkpoints. A Checkpoint takes one at once past 1 (docs/checkpoints.md)."""
        if not self.hold:
            return 0.0
        share = default_max_bytes(self.paths.root) // max(1, len(entries(self.paths.claimed)))
        return self.pending_bytes() / max(1, share)

    def state_dict(self):
        return {"position": self.position, "consumer": self.name}  # whose position: a commit moves its frames

    @property
    def spool_root(self):
        """The spool this source consumes: part of a checkpoint's identity (dflash_launch.checkpoint_identity)."""
        return os.path.abspath(self.paths.root)

    def committed_records(self):
        """{frame: checkpoint} of done/'s records (a restore checks them against the checkpoints it can take)."""
        return {} if self.warmup else committed_records(self.paths.root)

    def restore(self, state, positions=None, checkpoint=None):
        """Back to the position a checkpoint recorded (`state`: state_dict(); None: the start). With `checkpoint`
        (the restored one's path) the pending frames before the positions it recorded (`positions`: {consumer:
        position}, default this consumer's) are committed first -- the kill may have come between its rename and
        its commit; this consumer's pending frames after its position are delivered again first, in order."""
        position = int(state["position"]) if state else 0
        if self.warmup:
            return
        if checkpoint is not None:
            self.committed += commit_pending(self.paths.root, positions or {self.name: position}, checkpoint,
                                             self._recycle_committed)
        replay = [(pos, f, path) for pos, f, path in pending_frames(self.paths.root, self.name) if pos >= position]
        self._replay = {f: path for _, f, path in replay}
        if self.order is None:
            claimed = [f for f in self._take_back if f not in self._replay]
            self._take_back = [f for _, f, _ in replay] + claimed
        self.position = position

    @staticmethod
    def position_of(state):
        return int(state["position"])

    def commit(self, positions, checkpoint):
        """The checkpoint at `checkpoint` committed, having recorded `positions` ({consumer: position}): the frames
        acknowledged before them are done (their record names it); then the manifest, if that made the spool
        final."""
        if self.warmup:
            return 0
        self._released.sweep()  # the views gone since the last claim: their frames' bytes may go to the ring
        n = commit_pending(self.paths.root, positions, checkpoint, self._recycle_committed)
        self.committed += n
        self.write_manifest_if_final()
        return n

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

    def _recycle_committed(self, consumer, frame, path):
        """A committed frame's bytes to the ring: only this consumer's own, and none a view of it still maps
        (another consumer's, a rank of another process, may still hold its last sample's views)."""
        if consumer != self.name or frame in self._released.viewed():
            return False
        return ring.recycle_committed(self.paths, path, frame)

    def reject(self, claimed, reason):
        """Quarantines a claimed frame: rejected/<frame> and its reason beside it; never delivered again (a
        restart takes back claimed/ only, a producer resumes past it, the manifest lists it)."""
        dst = os.path.join(self.paths.rejected, claimed.file)
        atomic_write(dst + ".reason", reason + "\n")
        os.rename(claimed.path, dst)
        if claimed.mapped is not None and not claimed.mapped.in_use():
            claimed.mapped.release()
        claimed.mapped = None

    def ack(self, claimed):
        if self.hold:  # its checkpoint commits it (commit()); until then a restart delivers it again
            os.replace(claimed.path, os.path.join(self.paths.pending_of(self.name),
                                                  pending_name(claimed.position, claimed.file)))
            # Its bytes stay for a replay; its mapping goes with its last view (the commit unlinks the file).
            self._released.drop(claimed.mapped, None)
            claimed.mapped = None
            self.acked += 1
            return
        dst = os.path.join(self.paths.done, claimed.file)
        try:
            rename_noreplace(claimed.path, dst)
        except FileExistsError:
            raise SpoolError(f"frame {claimed.file} was acknowledged before (done/ has it): producer "
                             f"{claimed.producer} published sequence number {claimed.seq} twice") from None
        self._released.drop(claimed.mapped, dst)  # the name is the record; the bytes go with the last view
        claimed.mapped = None
        self.acked += 1
        self.write_manifest_if_final()

    def release(self):
        """Drops the bytes of the acknowledged frames no tensor maps any more (back to their producers, or
        truncated: the name in done/ is the record) and waits until they are gone; how many still wait for their
        last view. Every claim and acknowledgement does the same without the wait (a thread of the source's)."""
        still = self._released.sweep()
        self._released.flush()
        return still

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
                warmup_spent(self.name, self.synthetic, "synthetic frames from the spool")
            hidden, tokens = synthetic_frame(torch, self.contract, g)
            self.synthetic += 1
            yield {"hidden": hidden, "tokens": tokens, "seq": self.synthetic - 1, "producer": "(warm-up)",
                   "frame": None, "taken_back": False, "synthetic": True, "ack": lambda: None}

    def next_sample(self):
        """The next frame as a sample dict, or None once the spool has ended (every producer finished, nothing
        left to claim). A frame that violates [model] goes to rejected/ and raises FrameContractError.
        What iterating the source calls; dflash_launch.spool.world.WorldSource calls it once per round."""
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
        except OSError:
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
        """(hidden, tokens) of claimed frame `c`: views of its mapping, checked against [model] before any
        compute (the header, then every token id, read in the mapping)."""
        c.mapped = m = MappedFrame(c.path, self._maps)
        meta = m.meta
        # The contract, before any compute.
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

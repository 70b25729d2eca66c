"""The spool's producer: SpoolProducer publishes a Python target's frames (and
the shared weights) for the drafters."""

import json
import os

from dflash_launch._extras import require
from dflash_launch.exit_codes import use_exit_codes
from dflash_launch.spool import ring
from dflash_launch.spool.dirs import Paths, atomic_write, create_private, frame_names, default_manifest_path, \
    rename_noreplace, pending_frames, write_manifest_if_final, entries, spool_root_from_env
from dflash_launch.spool.format import (WEIGHTS_FORMAT, FrameContractError, SpoolError,
                                        st_dtype, check_frame, frame_file, frame_metadata,
                                        parse_frame_file)
from dflash_launch.spool.warmup import WARMUP_FRAMES, in_warmup, warmup_spent
from dflash_launch.spool.write import default_max_bytes, reserve_room, write_frame


class SpoolProducer:
    """Publishes frames for the drafters (a Python target). Resumes after its
    highest sequence number in the spool and removes its half-written temp
    files; waits while ready/ holds `max_ready` frames of its own or its frames
    hold its share of `max_bytes` (max_bytes / producers: write.reserve_room;
    its own, so that a consumer in a fixed order never waits for a producer that
    the others' frames stopped). A frame is written once, from the tensors'
    memory, into pages allocated first (over one of its acknowledged frames'
    files where the drafters handed one back: ring.py): a filesystem that cannot hold it raises
    SpoolFull with nothing published. In a warm-up it checks and discards what
    it publishes."""

    def __init__(self, root, name, contract, max_ready=16, producers=None, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES, max_bytes=None):
        """`producers` (default $DFLASH_SPOOL_PRODUCERS) and `manifest_path`
        (default $DFLASH_RUN_DIR/spool.json): for the manifest at finish().
        `max_bytes`: the byte budget (default write.default_max_bytes:
        $DFLASH_SPOOL_MAX_BYTES, else half the filesystem's free space)."""
        self.paths, self.name, self.contract, self.max_ready = Paths(root), name, contract, max(1, int(max_ready))
        self.max_bytes, self._staging = max_bytes, {}
        self.producers = int(os.environ.get("DFLASH_SPOOL_PRODUCERS", "0") or 0) if producers is None else producers
        self.manifest_path = manifest_path or default_manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = in_warmup(warmup), max(1, int(warmup_frames))
        self.discarded = 0
        if self.warmup:
            self.next_seq, self.finished = 0, False
            return  # a warm-up publishes nothing: the drafters' frames come from the real targets
        self.paths.create()
        if self.max_bytes is None:
            self.max_bytes = default_max_bytes(self.paths.root)
        for f in os.listdir(self.paths.tmp):
            pf = parse_frame_file(f[:-4]) if f.endswith(".tmp") else None
            if (pf and pf[0] == name) or f.endswith(f"@{name}.tmp"):
                os.unlink(os.path.join(self.paths.tmp, f))
        dirs = [self.paths.ready] + [self.paths.claimed_by(c) for c in os.listdir(self.paths.claimed)]
        pending = [f for c in entries(self.paths.pending) for _, f, _ in pending_frames(self.paths.root, c)]
        dirs += [self.paths.done, self.paths.rejected]
        seqs = [s for d in dirs for p, s in map(parse_frame_file, frame_names(d)) if p == name]
        seqs += [s for p, s in map(parse_frame_file, pending) if p == name]  # acknowledged, awaiting a checkpoint
        self.next_seq = max(seqs, default=-1) + 1
        self.finished = os.path.exists(os.path.join(self.paths.producers, f"{name}.done"))

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, producer count and manifest path from what dflash-launch
        sets; `name` defaults to DFLASH_PROCESS ("target:0")."""
        use_exit_codes()  # a payload of dflash-launch: an uncaught FrameContractError ends it with 65
        env = os.environ if env is None else env
        root = spool_root_from_env(env)
        return cls(root, name or env.get("DFLASH_PROCESS", "target"), contract,
                   producers=int(env.get("DFLASH_SPOOL_PRODUCERS", "0") or 0), manifest_path=default_manifest_path(root, env),
                   warmup=env.get("DFLASH_WARMUP") == "1", **kwargs)

    def check(self, hidden, tokens, metadata, seq):
        """Raises FrameContractError unless the frame matches [model]: the
        consumers' own check (check_frame), at the producer's end."""
        f = frame_file(self.name, seq)
        check_frame(self.contract, metadata, {"hidden": (st_dtype(hidden), list(hidden.shape)),
                                              "tokens": (st_dtype(tokens), list(tokens.shape))}, f)
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
                warmup_spent(self.name, self.discarded, "frames published (and discarded)")
            self.discarded += 1
            return seq
        f = frame_file(self.name, seq)
        tmp = os.path.join(self.paths.tmp, f + ".tmp")
        # tokens (int64) first: with the header padded to 8, every tensor's view is aligned.
        tensors = {"tokens": self._host("tokens", tokens), "hidden": self._host("hidden", hidden)}
        write_frame(tmp, tensors, meta,
                    reserve=lambda size: reserve_room(self.paths, size, self.max_bytes // max(1, self.producers),
                                                      self.max_ready, owner=self.name))
        rename_noreplace(tmp, os.path.join(self.paths.ready, f))
        self.next_seq = seq + 1
        return seq

    def _host(self, key, t):
        """`t` contiguous in host memory; a GPU tensor lands in a pinned staging buffer kept for the next frame
        (an asynchronous-capable D2H copy, no pageable bounce)."""
        t = t.detach()
        if t.device.type == "cpu":
            return t.contiguous()
        torch = require("torch", "publishing GPU tensors")
        buf = self._staging.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = self._staging[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t)
        return buf

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
        with create_private(tmp) as out:
            out.write(data)
        try:
            rename_noreplace(tmp, self.paths.weights)
            return True
        except FileExistsError:
            os.unlink(tmp)
            return False

    def finish(self):
        """The end marker; then, if the drafters already acknowledged every
        frame, the manifest (`producers` producers are expected)."""
        if self.warmup:
            return
        atomic_write(os.path.join(self.paths.producers, f"{self.name}.done"),
                      json.dumps({"producer": self.name, "frames": self.next_seq}) + "\n")
        ring.drop_free(self.paths, self.name)  # after the marker: no consumer hands a file back from now on
        self.finished = True
        write_manifest_if_final(self.paths.root, self.producers, self.manifest_path)

"""The spool's producer: SpoolProducer publishes a Python target's frames (and the shared weights) for the drafters,
through libdflash_spool.so (_native): the header, the write-once writev, the ring, the byte budget are C++'s."""

import json
import os

from dflash_launch._extras import require
from dflash_launch.exit_codes import use_exit_codes
from dflash_launch.spool import _native
from dflash_launch.spool.format import FrameContractError, check_frame, frame_file, frame_metadata, st_dtype
from dflash_launch.spool.dirs import Paths, default_manifest_path, default_max_bytes, spool_root_from_env, \
    write_manifest_if_final
from dflash_launch.spool.warmup import WARMUP_FRAMES, in_warmup, warmup_spent


def _tensors(named):
    """A dfs_tensor array over contiguous CPU tensors (kept alive by the caller until the call returns)."""
    arr, shapes = (_native.Tensor * len(named))(), []
    for i, (name, t) in enumerate(named):
        shape = (_native.c_int64 * t.dim())(*t.shape)
        shapes.append(shape)
        arr[i] = _native.Tensor(name.encode(), st_dtype(t).encode(), t.dim(), shape,
                                t.data_ptr() if t.numel() else None, t.numel() * t.element_size())
    return arr, shapes


class SpoolProducer:
    """Publishes frames for the drafters (a Python target). Resumes after its highest sequence number in the spool;
    waits while ready/ holds `max_ready` frames of its own or its frames hold its share of `max_bytes` (max_bytes /
    producers). A frame is written once, from the tensors' memory, into pages allocated first (over a file the
    drafters handed back, where one is): a filesystem that cannot hold it raises SpoolFull, nothing published. In a
    warm-up it checks and discards what it publishes."""

    def __init__(self, root, name, contract, max_ready=16, producers=None, manifest_path=None, warmup=None,
                 warmup_frames=WARMUP_FRAMES, max_bytes=None):
        """`producers` (default $DFLASH_SPOOL_PRODUCERS), `manifest_path` (default $DFLASH_RUN_DIR/spool.json): for
        the manifest at finish(). `max_bytes`: the byte budget (default_max_bytes)."""
        self.paths, self.name, self.contract, self.max_ready = Paths(root), name, contract, max(1, int(max_ready))
        self.max_bytes, self._staging = max_bytes, {}
        self.producers = int(os.environ.get("DFLASH_SPOOL_PRODUCERS", "0") or 0) if producers is None else producers
        self.manifest_path = manifest_path or default_manifest_path(self.paths.root)
        self.warmup, self.warmup_frames = in_warmup(warmup), max(1, int(warmup_frames))
        self.discarded, self._h = 0, None
        if self.warmup:
            self._seq, self._finished = 0, False
            return  # a warm-up publishes nothing: the drafters' frames come from the real targets
        if self.max_bytes is None:
            self.paths.create()
            self.max_bytes = default_max_bytes(self.paths.root)
        h = _native.c_void_p()
        _native.call("dfs_producer_open", _native.fs(root), name.encode(), self.max_ready, int(self.max_bytes),
                     max(1, self.producers), _native.byref(h))
        self._h, self._lib = h, _native.lib()

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.dfs_producer_close(self._h)
            self._h = None

    @property
    def next_seq(self):
        return self._seq if self._h is None else self._lib.dfs_producer_next_seq(self._h)

    @property
    def finished(self):
        return self._finished if self._h is None else bool(self._lib.dfs_producer_finished(self._h))

    @classmethod
    def from_env(cls, contract, name=None, env=None, **kwargs):
        """The run's spool, producer count and manifest path from what dflash-launch sets; `name`: DFLASH_PROCESS."""
        use_exit_codes()  # a payload of dflash-launch: an uncaught FrameContractError ends it with 65
        env = os.environ if env is None else env
        root = spool_root_from_env(env)
        return cls(root, name or env.get("DFLASH_PROCESS", "target"), contract,
                   producers=int(env.get("DFLASH_SPOOL_PRODUCERS", "0") or 0), manifest_path=default_manifest_path(root, env),
                   warmup=env.get("DFLASH_WARMUP") == "1", **kwargs)

    def check(self, hidden, tokens, metadata, seq):
        """Raises FrameContractError unless the frame matches [model]: the consumers' own check, at this end."""
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
        """Publishes one sample; returns its sequence number. Checks the contract first (FrameContractError, 65)
        unless check=False. Integer token ids become int64."""
        if not tokens.is_floating_point() and str(tokens.dtype) != "torch.int64":
            tokens = tokens.long()
        seq = self.next_seq
        meta = dict(frame_metadata(self.contract), **(metadata or {}), producer=self.name, seq=str(seq))
        if check:
            self.check(hidden, tokens, meta, seq)
        if self.warmup:
            if self.discarded >= self.warmup_frames:
                warmup_spent(self.name, self.discarded, "frames published (and discarded)")
            self.discarded += 1
            return seq
        # tokens (int64) first: with the header padded to 8, every tensor's view is aligned.
        named = [("tokens", self._host("tokens", tokens)), ("hidden", self._host("hidden", hidden))]
        arr, shapes = _tensors(named)
        out = _native.c_int64()
        _native.call("dfs_producer_publish", self._h, json.dumps({k: str(v) for k, v in meta.items()}).encode(),
                     len(named), arr, -1.0, _native.byref(out))
        return out.value

    def _host(self, key, t):
        """`t` contiguous in host memory; a GPU tensor lands in a pinned staging buffer kept for the next frame."""
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
        """The target's embedding and LM head ([vocab, hidden] each) for the drafters, once per spool (the first
        publisher wins); True if we did."""
        if self.warmup or os.path.exists(self.paths.weights):
            return False
        named = [("embed.weight", embed.detach().float().contiguous()),
                 ("lm_head.weight", lm_head.detach().float().contiguous())]
        arr, shapes = _tensors(named)
        won = _native.c_int32()
        names = _native.layout()
        _native.call("dfs_producer_publish_shared", self._h, names["weights_file"].encode(),
                     json.dumps({"format": names["weights_format"], "producer": self.name}).encode(), 2, arr,
                     _native.byref(won))
        return bool(won.value)

    def finish(self):
        """The end marker; then, if the drafters already acknowledged every frame, the manifest."""
        if self.warmup:
            return
        _native.call("dfs_producer_finish", self._h)
        write_manifest_if_final(self.paths.root, self.producers, self.manifest_path)

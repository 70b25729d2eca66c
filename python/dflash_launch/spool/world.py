"""Spool frames for a torch.distributed world (DDP, FSDP): every rank takes the same number of steps
(docs/builtin.md, "A DDP world on the spool", has the table of cases).

Each round the ranks agree (one all_gather of a flag per rank, over gloo) on what each holds: all a frame, every
rank steps; none, every loop ends at the same step; some (the tail), tail="pad" gives the others a copy of a peer's
frame ("padded", its ack does nothing) and tail="drop" acknowledges the holders' frames without a step; either way
that round is the last. A rank whose frame violates [model] raises FrameContractError (65) and its peers
WorldFrameRejected (65, naming the frame); a rank whose spool fails raises it and its peers WorldSpoolFailed (1).

order="fixed" (the default in a world of more than one) deals the spool's fixed order (libdflash_spool.so,
spool/spool_order.h): round k is entries kW .. kW+W-1, rank r the (kW+r)-th, so a restarted world replays exactly
what the killed one would have stepped on (docs/checkpoints.md); a slow producer paces the world. order="arrival"
deals what each rank claims first. Asking for the next frame acknowledges the last one, and so does the loop's end;
`sample["ack"](loss)` does it at once and records the loss (TrainingMetrics, $DFLASH_METRICS_FILE).

    init_process_group("nccl")                        # the role's world (world = "role" in run.toml)
    for sample in WorldSource.from_env(contract):     # on every rank, at the same point
        loss = model(sample["hidden"].cuda(), sample["tokens"].cuda()); loss.backward(); opt.step()
        sample["ack"](loss)                           # optional: records the loss

Without an initialised process group (or in a warm-up) the world is this process alone. The agreement runs on the
world's group when its backend has gloo, else on one gloo group made at construction (every rank must reach it).
"""

import sys

from dflash_launch._extras import require
from dflash_launch.exit_codes import release_process_groups_at_exit
from dflash_launch.spool.format import FrameContractError, SpoolError
from dflash_launch.spool.source import SpoolSource
from dflash_launch.train_metrics import TrainingMetrics

TAILS = ("pad", "drop")
ORDERS = ("fixed", "arrival")
_HAVE, _END, _BAD, _FAIL = 1, 0, -1, -2


class WorldSpoolFailed(SpoolError):
    """A peer's spool failed (not its frame: its files): this rank stops with it rather than wait for it."""

    def __init__(self, name, rank, failed_ranks):
        who = ", ".join(str(r) for r in failed_ranks)
        super().__init__(f"{name} (rank {rank}) stops: the spool of rank {who} failed (its stderr says why); a "
                         f"world cannot step without one of its ranks")


class WorldFrameRejected(FrameContractError):
    """A peer's frame violated [model]: this rank stops with it (exit 65) rather than wait for it."""

    def __init__(self, name, rank, bad_ranks, frames=None):
        """`frames`: {rank: (frame, producer, what)} of the bad ranks, as they said in the agreement."""
        frames = frames or {}
        first = frames.get(bad_ranks[0], (None, None, None))
        self.frame, self.producer, self.what = first[0], first[1], "a peer's frame was rejected"
        self.expected = self.found = self.fix = ""
        who = ", ".join(str(r) for r in bad_ranks)
        named = "; ".join(f"rank {r}: frame {frames[r][0]} from producer {frames[r][1]} ({frames[r][2]})"
                          for r in bad_ranks if r in frames)
        super(FrameContractError, self).__init__(
            f"{name} (rank {rank}) stops: the frame of rank {who} violated [model] and was quarantined in "
            f"rejected/ ({named or 'its stderr says why'}); a world cannot step without one of its ranks. The "
            f"frames this rank holds stay claimed: a restart takes them back")


def _group_for(dist, group):
    """The group the agreement runs on: `group`, the world's own if its backend speaks gloo, else a new gloo
    group (a collective: every rank makes it)."""
    if group is not None:
        return group
    if "gloo" in str(dist.get_backend()):
        return None
    return dist.new_group(backend="gloo")


class WorldSource:
    def __init__(self, source, tail="pad", group=None, metrics=None, say=None, order="fixed"):
        """`source`: this process's SpoolSource. `tail`: "pad" or "drop" (above). `group`: a gloo-capable group
        to agree on (default: the world). `metrics`: a TrainingMetrics (default: one on $DFLASH_METRICS_FILE).
        `order`: "fixed" or "arrival" (above; a world of one always takes frames as they arrive)."""
        if tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}, not {tail!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
        self.source, self.tail = source, tail
        self.torch = require("torch", "dflash_launch.spool.world")
        self.dist = require("torch.distributed", "dflash_launch.spool.world")
        self.metrics = metrics if metrics is not None else TrainingMetrics()
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self.padded = self.dropped = self.rounds = 0
        self.group, self.rank, self.world = None, 0, 1
        if self.dist.is_available() and self.dist.is_initialized() and not source.warmup:
            release_process_groups_at_exit(self.dist)
            self.group = _group_for(self.dist, group)
            self.rank, self.world = self.dist.get_rank(self.group), self.dist.get_world_size(self.group)
        self._pending = None  # the last sample handed out, until it is acknowledged
        self.fixed = order == "fixed" and self.world > 1
        self.on_end = []      # called once when the loop ends (a Checkpoint's last save)
        self._ended = False
        self._said_rejected = set()
        self._set_order(0)

    def _set_order(self, start_round):
        if self.fixed:
            skipped = self.source.set_order(self.rank, self.world, start_round)
            if skipped and set(skipped) != self._said_rejected:
                self._said_rejected = set(skipped)
                self.say(f"{self.name}: the fixed order skips the {len(skipped)} quarantined frame(s) in "
                         f"rejected/ ({', '.join(sorted(skipped))}; each with its .reason) on every rank: "
                         f"the world stays in step past them")

    @classmethod
    def from_env(cls, contract, name=None, tail="pad", group=None, metrics=None, env=None, order="fixed", **kwargs):
        """SpoolSource.from_env(contract, name, env, **kwargs) for this rank, in the world."""
        return cls(SpoolSource.from_env(contract, name, env=env, **kwargs), tail=tail, group=group, metrics=metrics,
                   order=order)

    @property
    def name(self):
        return self.source.name

    def shared_weights(self, **kwargs):
        return self.source.shared_weights(**kwargs)

    def stats(self):
        skipped = self.source.order_skipped() if self.fixed else []
        return dict(self.source.stats(), world=self.world, rounds=self.rounds, frames_padded=self.padded,
                    frames_dropped=self.dropped, tail=self.tail, order="fixed" if self.fixed else "arrival",
                    rejected_skipped=skipped)

    # With a checkpoint (dflash_launch.Checkpoint) -------------------------------

    def consumer_names(self):
        """Every rank's consumer name, in rank order (a collective in a world): whose pending frames rank 0
        commits."""
        if self.world == 1:
            return [self.name]
        names = [None] * self.world
        self.dist.all_gather_object(names, self.name, group=self.group)
        return names

    def hold_for_checkpoint(self):
        self.source.hold_for_checkpoint()

    def pending_level(self):
        return self.source.pending_level()

    def ack_pending(self):
        """Acknowledges the sample of the step that just ran (a checkpoint covers it: it must be pending)."""
        self._ack_pending()

    def state_dict(self):
        return {"rounds": self.rounds, "source": self.source.state_dict()}

    @property
    def spool_root(self):
        return self.source.spool_root

    def committed_records(self):
        return self.source.committed_records()

    def restore(self, state, positions=None, checkpoint=None):
        """Back to the round a checkpoint recorded (None: the start); see SpoolSource.restore."""
        self.rounds = int(state["rounds"]) if state else 0
        self.source.restore(state["source"] if state else None, positions, checkpoint)
        self._set_order(self.rounds)

    @staticmethod
    def position_of(state):
        return int(state["source"]["position"])

    def commit(self, positions, checkpoint):
        """A checkpoint committed: see SpoolSource.commit."""
        return self.source.commit(positions, checkpoint)

    # Stateful (dflash_launch.stateful): what a Checkpoint carries and tells; each delegates to the above.

    def load_state_dict(self, state):
        self.restore(state)

    def start_over(self):
        self.restore(None)

    def attached(self, finish):
        self.hold_for_checkpoint()
        self.on_end.append(finish)  # the loop's end writes the last checkpoint, on every rank at the same round

    @property
    def identity(self):
        return self.spool_root

    def step_ended(self):
        self.ack_pending()

    def checkpoint_committed(self, states, checkpoint):
        """Every rank's frames before the positions its state holds (through commit(): one place to watch)."""
        self.commit({s["source"]["consumer"]: s["source"]["position"] for s in states if s}, checkpoint)

    # Acknowledging ------------------------------------------------------------

    def _wrap(self, sample):
        """The sample with an ack that runs once, records the step (and its loss) and is what the next request
        calls if nobody did."""
        acknowledge, done = sample["ack"], []

        def ack(loss=None):
            if done:
                return
            done.append(True)
            acknowledge()
            self.metrics.step(loss)
            self.metrics.update(**self.stats())

        sample["ack"] = ack
        self.rounds += 1
        self._pending = sample
        return sample

    def _ack_pending(self):
        if self._pending is not None:
            self._pending["ack"]()
            self._pending = None

    # The rounds ---------------------------------------------------------------

    def _gather(self, flag):
        torch = self.torch
        mine = torch.tensor([flag], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        self.dist.all_gather(every, mine, group=self.group)
        return [int(t.item()) for t in every]

    def _peer(self, rank):
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def _bad_frames(self, error):
        """{rank: (frame, producer, what)} of the ranks whose frame was rejected this round (a collective every
        rank joins once a flag said _BAD), so each peer's verdict names the frame and its producer."""
        mine = None
        if isinstance(error, FrameContractError):
            mine = (error.frame, error.producer, error.what)
        every = [None] * self.world
        self.dist.all_gather_object(every, mine, group=self.group)
        return {r: x for r, x in enumerate(every) if x is not None}

    def _pad(self, sample, flags):
        """The tail, pad: each rank without a frame gets a copy of one a holder has (holders in turn)."""
        torch, dist = self.torch, self.dist
        names = [None] * self.world
        mine = (sample["frame"], sample["producer"], sample["seq"]) if sample else None
        dist.all_gather_object(names, mine, group=self.group)
        holders = [r for r, f in enumerate(flags) if f == _HAVE]
        empties = [r for r, f in enumerate(flags) if f != _HAVE]
        plan = {e: holders[i % len(holders)] for i, e in enumerate(empties)}
        for e, h in plan.items():
            if h == self.rank:  # as bytes: gloo moves any dtype that way (bf16 included)
                dist.send(sample["hidden"].contiguous().view(torch.uint8), self._peer(e), group=self.group)
                dist.send(sample["tokens"].contiguous(), self._peer(e), group=self.group)
        if self.rank not in plan:
            return sample
        c = self.source.contract
        b, s, width = c["batch"], c["seq_len"], len(c["tapped_layers"]) * c["hidden"]
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(c["dtype"], torch.float32)
        hidden, tokens = torch.empty(b, s, width, dtype=dtype), torch.empty(b, s, dtype=torch.long)
        h = plan[self.rank]
        dist.recv(hidden.view(torch.uint8), self._peer(h), group=self.group)
        dist.recv(tokens, self._peer(h), group=self.group)
        frame, producer, seq = names[h]
        self.padded += 1
        return {"hidden": hidden, "tokens": tokens, "seq": seq, "producer": producer, "frame": frame,
                "taken_back": False, "padded": True, "ack": lambda: None}

    def _drop(self, sample, flags):
        if sample is not None:
            sample["ack"]()  # acknowledged, never stepped on: the record says so
            self.dropped += 1
            self.say(f"{self.name}: tail = \"drop\": frame {sample['frame']} acknowledged without a step (the last "
                     f"round had {flags.count(_HAVE)} frames for {self.world} ranks)")
        return None

    def next_sample(self):
        """The sample of the next step, the same round on every rank, or None when every rank is done."""
        if self.world == 1:
            self._ack_pending()
            sample = self.source.next_sample()
            return self._wrap(sample) if sample is not None else self._finish()
        error, sample = None, None
        try:  # whatever fails here, the peers learn it in this round's agreement, never wait for this rank in it
            self._ack_pending()
            sample = self.source.next_sample()
        except Exception as e:  # noqa: BLE001 -- raised again below, after the peers were told
            error = e
        flag = _HAVE if sample is not None else _END
        if error is not None:
            flag = _BAD if isinstance(error, FrameContractError) else _FAIL
        flags = self._gather(flag)
        bad = [r for r, f in enumerate(flags) if f == _BAD]
        frames = self._bad_frames(error) if bad else {}
        if error is not None:
            raise error
        if bad:
            raise WorldFrameRejected(self.name, self.rank, bad, frames)
        failed = [r for r, f in enumerate(flags) if f == _FAIL]
        if failed:
            raise WorldSpoolFailed(self.name, self.rank, failed)
        if all(f == _HAVE for f in flags):
            return self._wrap(sample)
        if all(f == _END for f in flags):
            return self._finish()
        # The tail: some ranks hold a frame, the others found the spool ended. After it every source has
        # ended, so the next round finds all of them so and ends every loop at the same step.
        if self.tail == "drop":
            self._drop(sample, flags)
            return self._finish()
        return self._wrap(self._pad(sample, flags))

    def _finish(self):
        if not self._ended:
            self._ended = True
            for hook in self.on_end:
                hook()
        self.metrics.update(**self.stats())
        self.metrics.write()
        return None

    def __iter__(self):
        return iter(self.next_sample, None)

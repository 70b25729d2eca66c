"""The spool's frames in one fixed order, whatever the timing: what WorldSource deals to a DDP world's ranks, so
a restarted world replays exactly what the killed one would have stepped on (docs/checkpoints.md).

The order: producers by name, sequence numbers in turns -- cycle c takes frame c of each producer (sorted by
name) that publishes more than c frames. With producers A (3 frames) and B (1): A0 B0 A1 A2. Rank r of a world of W
takes entries r, r + W, r + 2W, ...: round k of the world is entries kW .. kW + W - 1.

An entry is known once its producer published it (it is somewhere in the spool) or said how many it publishes
(producers/<name>.done); until then the ranks wait: the cost of a fixed order is that a slow producer paces the
world (docs/benchmarks.md, "Ordered delivery"). The producers' names must all be known before cycle 0 (each
producer's first frame or its end marker names it); the count comes from DFLASH_SPOOL_PRODUCERS.

A frame quarantined in rejected/ before the walk began is not in the order: every rank of the world skips it alike
(each builds its order at the world's start, when rejected/ holds the same frames for all), so a world stopped by a
bad frame resumes past it, in step, instead of meeting it again. A frame is rejected only by the round that meets it,
and that round ends the world (exit 65): every checkpoint the world resumes from lies before it, so the entries up
to the restored round are the same with or without it.
"""

import json
import os
import time

from dflash_launch.spool.dirs import Paths, frame_names, parse_pending
from dflash_launch.spool.format import SpoolError, frame_file, parse_frame_file


class SpoolOrder:
    """Walks the fixed order for one rank: next() is the (producer, seq) of this rank's next entry, or None once
    the order has ended before it. Blocks (polling) while the entry is not known yet."""

    def __init__(self, root, producers, rank=0, world=1, start_round=0, poll_s=0.01):
        if producers <= 0:
            raise SpoolError("a fixed frame order needs the number of producers (DFLASH_SPOOL_PRODUCERS)")
        self.paths, self.producers, self.rank, self.world = Paths(root), int(producers), int(rank), int(world)
        self.poll_s = poll_s
        self.names = None            # the producers, sorted, once all are known
        self.high = {}               # producer -> highest seq seen anywhere
        self.count = {}              # producer -> frames it published (its end marker)
        self.cycle, self.slot = 0, 0  # the walk's cursor: cycle c, producer index in it
        self.index = 0               # entries walked so far
        self.waited_s = 0.0
        self._skip = int(start_round) * self.world + self.rank
        self.rejected = set(frame_names(self.paths.rejected))  # out of the order (above)
        self.skipped = []            # the rejected frames the walk passed, in order

    # What the spool holds --------------------------------------------------------------------------------------

    def _scan(self):
        """Every producer's highest seq and end count, listing the directories in the frames' own direction
        (ready -> claimed -> pending -> done/rejected) so a frame moving while we look is seen further on."""
        p = self.paths
        seen = list(frame_names(p.ready))
        for parent in (p.claimed, p.pending):
            try:
                subs = os.listdir(parent)
            except FileNotFoundError:
                subs = []
            for c in subs:
                try:
                    names = os.listdir(os.path.join(parent, c))
                except FileNotFoundError:
                    continue
                if parent == p.pending:
                    seen += [pp[1] for pp in map(parse_pending, names) if pp]
                else:
                    seen += [n for n in names if parse_frame_file(n)]
        seen += frame_names(p.done) + frame_names(p.rejected)
        for f in seen:
            prod, seq = parse_frame_file(f)
            if seq > self.high.get(prod, -1):
                self.high[prod] = seq
        try:
            markers = [f for f in os.listdir(p.producers) if f.endswith(".done")]
        except FileNotFoundError:
            markers = []
        for f in markers:
            prod = f[:-5]
            if prod in self.count:
                continue
            try:
                with open(os.path.join(p.producers, f)) as fh:
                    self.count[prod] = int(json.load(fh)["frames"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written: the next scan reads it
        if self.names is None:
            known = sorted(set(self.high) | set(self.count))
            if len(known) > self.producers:
                raise SpoolError(f"the spool has frames from {len(known)} producers ({', '.join(known)}) but "
                                 f"DFLASH_SPOOL_PRODUCERS is {self.producers}: the fixed order needs them all "
                                 f"named up front; use a fresh spool, or set the producer count")
            if len(known) == self.producers:
                self.names = known

    def _has(self, prod, cycle):
        """True/False: producer `prod` publishes frame `cycle`; None: not known yet."""
        if cycle <= self.high.get(prod, -1):
            return True
        if prod in self.count:
            return cycle < self.count[prod]
        return None

    def _ended(self):
        return self.names is not None and all(p in self.count and self.cycle >= self.count[p] for p in self.names)

    # The walk --------------------------------------------------------------------------------------------------

    def _next_entry(self):
        """The next entry of the whole order (any rank's), or None at its end."""
        t0, delay, waited = time.monotonic(), 1e-4, False
        while True:
            if self.names is not None:
                while True:
                    if self._ended():
                        return None
                    if self.slot >= len(self.names):
                        self.cycle, self.slot = self.cycle + 1, 0
                        continue
                    prod = self.names[self.slot]
                    has = self._has(prod, self.cycle)
                    if has is None:
                        break  # not known yet: look again
                    self.slot += 1
                    if has:
                        if waited:
                            self.waited_s += time.monotonic() - t0
                        return prod, self.cycle
            if waited:
                time.sleep(delay)
                delay = min(delay * 2, self.poll_s)
            waited = True
            self._scan()

    def next(self):
        """This rank's next (producer, seq), or None: the order ended before it."""
        while True:
            entry = self._next_entry()
            if entry is None:
                return None
            if frame_file(*entry) in self.rejected:
                self.skipped.append(frame_file(*entry))
                continue
            i = self.index
            self.index += 1
            if i >= self._skip and (i - self.rank) % self.world == 0:
                return entry

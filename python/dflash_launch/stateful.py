"""What a Checkpoint carries besides the model and the optimizer, and what it tells each of them.

`Stateful` is torch.distributed.checkpoint.stateful.Stateful's shape (the one torchtitan's CheckpointManager
takes): `state_dict()` and `load_state_dict(state)`. A data-loader cursor, a sampler, a counter of one's own needs
nothing more: `Checkpoint(model, opt, states=[cursor])` saves its state in each rank's file and loads it back.

`Committing` adds what a state whose effects become final only with a checkpoint needs (the spool's sources: an
acknowledged frame waits in pending/ until the checkpoint covering it commits). Every hook is declared here, so
Checkpoint calls them on anything it carries, never guessing: a plain Stateful gets `CommitHooks`' defaults (each
does nothing). Called on every rank unless said:

- `attached(finish)`: once, from Checkpoint(...): from now on its effects wait for a commit; `finish()` writes
  a last checkpoint (a source calls it when it ends).
- `identity`: what it consumes ("" for none; the spool's root for a source): part of the checkpoint's identity.
  A checkpoint of another identity (adopted from another run) loads the model, not this: `start_over()` instead.
- `start_over()`: no checkpoint to load it from (or one of another identity): from the beginning.
- `load_state_dict(state)`: the state a checkpoint holds for this rank.
- `step_ended()`: first thing in each Checkpoint.step(): what the step consumed is covered by the checkpoint
  taken now (WorldSource acknowledges the step's frame).
- `pending_level()`: what waits for a commit over its share of a budget: over 1 a checkpoint is taken now, over 2
  while one is in flight the step waits for its commit (the spool's byte budget, docs/checkpoints.md).
- `committed_records()`: rank 0, before a restore: {item: checkpoint path} of what earlier commits made final
  (the spool's done/ records), so a restore that would redo or skip them is refused.
- `checkpoint_committed(states, checkpoint)`: rank 0, once the checkpoint at `checkpoint` is committed (and again
  when a restore takes it: it must be idempotent): commit up to the positions `states` hold (every rank's
  state_dict() in that checkpoint, in rank order).
- `metrics`: the process's TrainingMetrics if it holds one (None): the Checkpoint reports there, one writer per
  process.
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint.stateful.Stateful: what a checkpoint saves and loads."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state_dict: dict) -> None: ...


@runtime_checkable
class Committing(Stateful, Protocol):
    """A Stateful whose effects a checkpoint commits (above: each hook and when it is called)."""

    identity: str
    metrics: object

    def attached(self, finish) -> None: ...

    def start_over(self) -> None: ...

    def step_ended(self) -> None: ...

    def pending_level(self) -> float: ...

    def committed_records(self) -> dict: ...

    def checkpoint_committed(self, states: list, checkpoint: str) -> None: ...


class CommitHooks:
    """Committing's hooks, each doing nothing: subclass it and write the ones a state needs."""

    identity = ""
    metrics = None

    def attached(self, finish):
        pass

    def start_over(self):
        pass

    def step_ended(self):
        pass

    def pending_level(self):
        return 0.0

    def committed_records(self):
        return {}

    def checkpoint_committed(self, states, checkpoint):
        pass


_HOOKS = ("attached", "start_over", "step_ended", "pending_level", "committed_records",
          "checkpoint_committed")


class _Plain(CommitHooks):
    """A plain Stateful, carried with the default hooks."""

    def __init__(self, inner):
        self.inner = inner

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)


def committing(obj):
    """`obj` as a Committing: itself if it is one, a plain Stateful with the default hooks; else a TypeError that
    says what it lacks."""
    if isinstance(obj, Committing):
        return obj
    hooks = [m for m in _HOOKS if hasattr(obj, m)]
    if isinstance(obj, Stateful) and not hooks:
        return _Plain(obj)
    if isinstance(obj, Stateful):  # some hooks, not all: which it meant to be is not guessed
        raise TypeError(f"Checkpoint: {type(obj).__name__} has {', '.join(hooks)} of dflash_launch.stateful's "
                        f"Committing but not {', '.join(m for m in _HOOKS if m not in hooks)}: subclass CommitHooks "
                        f"(each hook does nothing by default)")
    lacks = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
    raise TypeError(f"Checkpoint: {type(obj).__name__} is not a Stateful (it lacks {', '.join(lacks)}): give it "
                    f"state_dict() and load_state_dict(state) (dflash_launch.stateful)")

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

Its parts: the frame format and the errors (spool_format), the directories,
their renames and the manifest (spool_dirs), what a warm-up sees
(spool_warmup), the consumer (spool_source) and the producer (spool_producer).
Every public name is importable from here, as before the split.
"""

from dflash_launch import HiddenStateContractError, check_hidden_shape, shape_string  # noqa: F401 (re-exported)
from dflash_launch.spool_dirs import Paths, manifest, private_makedirs, write_manifest_if_final  # noqa: F401
from dflash_launch.spool_format import (  # noqa: F401
    EXIT_FRAME_CONTRACT, EXT, FORMAT, WEIGHTS_FORMAT, FrameContractError, SpoolError, check_frame, frame_bytes,
    frame_file, frame_metadata, parse_frame_file, parse_header)
from dflash_launch.spool_producer import SpoolProducer  # noqa: F401
from dflash_launch.spool_source import SpoolSource  # noqa: F401
from dflash_launch.spool_warmup import WARMUP_FRAMES  # noqa: F401

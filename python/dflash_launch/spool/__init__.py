"""The hidden-state spool, Python side: the same protocol as the builtin roles
(worker/builtin/spool.h; docs/builtin.md), on a plain directory (default under
/dev/shm) and atomic renames.

    tmp/        a producer writes a frame here first
    ready/      published: <producer>-<seq:010d>.safetensors (rename, never replacing)
    claimed/<consumer>/   claimed by exactly one consumer (rename from ready/)
    done/       acknowledged after the step (then emptied: its bytes go to free/ or are truncated)
    free/       acknowledged frames' files, for their producer to write its next frames over (ring)
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
WARMUP_FRAMES frames gets WarmupSpent (exit_code 0: those steps compiled what
the role needs) after a message that names notify_ready() and is_warmup().

The spool raises; it never exits. A FrameContractError carries exit_code 65,
which the supervisor never restarts (a restart meets the same frame, or
publishes the same shapes): from_env() opts the process into ending with it
when nobody catches it (dflash_launch/exit_codes.py); a source built by hand
leaves that to its caller (dflash_launch.use_exit_codes()).

Its parts, one job each: the frame format and the errors (format), the
directories, their renames and the manifest (dirs), what a warm-up sees
(warmup), the consumer (source) and its mapped frames (mapped), the producer
(producer) and how it writes a frame within the byte budget (write), the ring
of reused frame files between them (ring), a DDP
world's equal steps (world) over a fixed order of frames (order). The names
below are the package's API; a submodule's other names are its parts' own.
"""

from dflash_launch import HiddenStateContractError, check_hidden_shape, shape_string  # noqa: F401 (re-exported)
from dflash_launch.spool.dirs import Paths, manifest, private_makedirs, write_manifest_if_final  # noqa: F401
from dflash_launch.spool.format import (  # noqa: F401
    EXIT_FRAME_CONTRACT, EXT, FORMAT, WEIGHTS_FORMAT, FrameContractError, SpoolError, check_frame, frame_bytes,
    frame_file, frame_metadata, parse_frame_file, parse_header)
from dflash_launch.spool.producer import SpoolProducer  # noqa: F401
from dflash_launch.spool.source import SpoolSource  # noqa: F401
from dflash_launch.spool.warmup import WARMUP_FRAMES, WarmupSpent  # noqa: F401
from dflash_launch.spool.world import WorldFrameRejected, WorldSource, WorldSpoolFailed  # noqa: F401,E402

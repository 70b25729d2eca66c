"""The hidden-state spool, Python side: thin classes over libdflash_spool.so, the one implementation of the spool's
protocol (spool/spool.h; docs/builtin.md, "The spool"), loaded with ctypes at the first use (_native). Its states
are directories of one spool dir (default under /dev/shm):

    tmp/ ready/ claimed/<consumer>/ pending/<consumer>/ done/ rejected/ producers/<p>.done free/ weights.safetensors

SpoolSource is the consumer the reference drafter uses (`--source spool`); SpoolProducer lets a Python target
publish frames the builtin drafter reads; WorldSource deals them to a torch.distributed world in equal rounds.
Under dflash-launch all come from the environment: `SpoolProducer.from_env(contract)`, `SpoolSource.from_env(contract)`.
Frames are safetensors files whose metadata carries the contract; a consumer checks it, with the tensors' dtypes and
shapes, before any compute, and a producer checks the same before it publishes. Python keeps what faces torch and
the user: the tensors' views of the mapped frames and their lifetime (mapped), the contract's errors (format), the
warm-up's synthetic frames (warmup), the world's agreement (world).

In a warm-up (DFLASH_WARMUP=1) both stay off the spool: a source yields synthetic frames of [model], a producer
checks and discards what it publishes; after WARMUP_FRAMES without READY, WarmupSpent (exit_code 0).

The spool raises; it never exits. A FrameContractError carries exit_code 65, which the supervisor never restarts:
from_env() opts the process into ending with it when nobody catches it (dflash_launch/exit_codes.py).
"""

from dflash_launch import HiddenStateContractError, check_hidden_shape, shape_string  # noqa: F401 (re-exported)
from dflash_launch.spool._native import SpoolFull  # noqa: F401
from dflash_launch.spool.dirs import (Paths, default_max_bytes, manifest, private_makedirs,  # noqa: F401
                                      spool_bytes, write_manifest_if_final)
from dflash_launch.spool.format import (  # noqa: F401
    EXIT_FRAME_CONTRACT, FrameContractError, SpoolError, check_frame, frame_bytes, frame_file, frame_metadata,
    parse_frame_file, parse_header)
from dflash_launch.spool.producer import SpoolProducer  # noqa: F401
from dflash_launch.spool.source import SpoolSource  # noqa: F401
from dflash_launch.spool.warmup import WARMUP_FRAMES, WarmupSpent  # noqa: F401
from dflash_launch.spool.world import WorldFrameRejected, WorldSource, WorldSpoolFailed  # noqa: F401,E402


def __getattr__(name):  # EXT, FORMAT, WEIGHTS_FORMAT: the library's names, read at their first use (format.py)
    from dflash_launch.spool import format
    return getattr(format, name)

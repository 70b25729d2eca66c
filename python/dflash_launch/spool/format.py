"""The spool's frame format as Python sees it: file names, a frame's metadata, the contract's check (C++'s,
spool/frame_contract.cc: the consumers' and the producers' alike) and the errors a broken spool or a misfit frame
raises."""

import json
import re

from dflash_launch import HiddenStateContractError
from dflash_launch._extras import require

# FORMAT, WEIGHTS_FORMAT, EXT: the library's (contract/spool_layout.h), read at their first use (__getattr__), so
# that importing the package loads nothing.
_LAYOUT_NAMES = {"FORMAT": "frame_format", "WEIGHTS_FORMAT": "weights_format", "EXT": "frame_ext"}
#: A consumer that meets a frame violating the contract exits with this (EX_DATAERR): common/exit_codes.h's
#: kFrameContract (tests/test_exit_codes.py checks they agree); dflash_launch/exit_codes.py makes it the exit status.
EXIT_FRAME_CONTRACT = 65
_PUBLIC_MODULE = "dflash_launch.spool"  # a traceback reads dflash_launch.spool.FrameContractError


class SpoolError(RuntimeError):
    """The spool itself is broken (I/O, a frame acknowledged twice)."""

    __module__ = _PUBLIC_MODULE


class FrameContractError(HiddenStateContractError):
    """A frame that does not match [model]. `str(e)` names the frame, its producer, what was expected, what was found
    and the fix; the same text the builtin C++ consumer prints."""

    __module__ = _PUBLIC_MODULE
    exit_code = EXIT_FRAME_CONTRACT

    def __init__(self, frame, producer, what, expected, found, fix):
        self.frame, self.producer, self.what = frame, producer, what
        self.expected, self.found, self.fix = expected, found, fix
        super().__init__(f"frame {frame} from producer {producer} does not match [model]: {what}\n"
                         f"  expected: {expected}\n  found:    {found}\n  fix (in producer {producer}): {fix}")


_TORCH_TO_ST = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.int64": "I64",
                "torch.int32": "I32", "torch.float64": "F64"}
_VIOLATION = re.compile(r"frame (.+?) from producer (.+?) does not match \[model\]: (.*?)\n  expected: (.*?)\n"
                        r"  found:    (.*?)\n  fix \(in producer .+?\): (.*)\Z", re.S)


def _layout(key):
    from dflash_launch.spool import _native
    return _native.layout()[key]


def __getattr__(name):
    if name in _LAYOUT_NAMES:
        return _layout(_LAYOUT_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def st_dtype(t):
    return _TORCH_TO_ST.get(str(t.dtype), str(t.dtype))


def frame_file(producer, seq):
    return f"{producer}-{int(seq):0{_layout('seq_digits')}d}{_layout('frame_ext')}"


def parse_frame_file(name):
    """(producer, seq) of a frame file name, or None for anything else."""
    ext = _layout("frame_ext")
    producer, dash, seq = name[:-len(ext)].rpartition("-") if name.endswith(ext) else ("", "", "")
    return (producer, int(seq)) if dash and producer and seq.isdigit() else None


def check_frame(contract, metadata, tensors, frame):
    """Raises FrameContractError unless a frame's metadata and tensors (name -> (safetensors dtype, shape)) match
    the contract (contract_from_env())."""
    from dflash_launch.spool import _native
    header = {k: {"dtype": d, "shape": list(shape)} for k, (d, shape) in tensors.items()}
    header["__metadata__"] = {k: str(v) for k, v in (metadata or {}).items()}
    keys = ("batch", "seq_len", "hidden", "tapped_layers", "dtype", "vocab", "target_layers")
    message = _native.call_text("dfs_check_frame", json.dumps({k: contract[k] for k in keys}).encode(),
                                json.dumps(header).encode(), frame.encode(), violation=True)
    if message is not None:
        raise FrameContractError(*_VIOLATION.match(message).groups())


def parse_header(data):
    """(metadata, {name: (dtype, shape)}) of safetensors bytes, checked by the C++ reader (ValueError: what is
    wrong)."""
    from dflash_launch.spool import _native
    h = _native.call_json("dfs_parse_header", data, len(data))
    return h.pop("__metadata__"), {k: (v["dtype"], v["shape"]) for k, v in h.items()}


def frame_bytes(hidden, tokens, metadata):
    """A frame as safetensors bytes (no checks: see SpoolProducer.publish)."""
    save = require("safetensors.torch", "writing spool frames").save
    return save({"hidden": hidden.contiguous(), "tokens": tokens.contiguous()},
                metadata={k: str(v) for k, v in metadata.items()})


def frame_metadata(contract):
    """The contract part of a frame's metadata (producer and seq are added at publish)."""
    c = contract
    return {"format": _layout("frame_format"), "layer_ids": ",".join(str(i) for i in c["tapped_layers"]), "hidden": str(c["hidden"]),
            "layout": "concat", "dtype": c["dtype"], "target_layers": str(c["target_layers"]), "vocab": str(c["vocab"])}

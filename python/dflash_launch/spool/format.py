"""The spool's frame format: file names, the contract in a frame's metadata and
its check (the consumers' and the producers' alike), safetensors bytes, and the
errors a broken spool or a misfit frame raises (dflash_launch.spool says how
the parts fit together)."""

import json
import re

from dflash_launch import HiddenStateContractError
from dflash_launch._extras import require

FORMAT = "dflash-frame/1"
WEIGHTS_FORMAT = "dflash-weights/1"
EXT = ".safetensors"
#: A consumer that meets a frame violating the contract exits with this (EX_DATAERR): common/exit_codes.h's
#: kFrameContract (tests/test_exit_codes.py checks they agree). FrameContractError carries it as `exit_code`;
#: dflash_launch/exit_codes.py turns it into the process's exit status where the process opted in.
EXIT_FRAME_CONTRACT = 65



# The errors keep the module users import them from: a traceback reads dflash_launch.spool.FrameContractError.
_PUBLIC_MODULE = "dflash_launch.spool"


class SpoolError(RuntimeError):
    """The spool itself is broken (I/O, a frame acknowledged twice)."""

    __module__ = _PUBLIC_MODULE


class FrameContractError(HiddenStateContractError):
    """A frame that does not match [model]. `str(e)` names the frame, its
    producer, what was expected, what was found and the fix; the same text
    the builtin C++ consumer prints."""

    __module__ = _PUBLIC_MODULE
    exit_code = EXIT_FRAME_CONTRACT

    def __init__(self, frame, producer, what, expected, found, fix):
        self.frame, self.producer, self.what = frame, producer, what
        self.expected, self.found, self.fix = expected, found, fix
        super().__init__(f"frame {frame} from producer {producer} does not match [model]: {what}\n"
                         f"  expected: {expected}\n  found:    {found}\n  fix (in producer {producer}): {fix}")


_TORCH_TO_ST = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.int64": "I64",
                "torch.int32": "I32", "torch.float64": "F64"}


def st_dtype(t):
    return _TORCH_TO_ST.get(str(t.dtype), str(t.dtype))


def frame_file(producer, seq):
    return f"{producer}-{int(seq):010d}{EXT}"


def parse_frame_file(name):
    """(producer, seq) of a frame file name, or None for anything else."""
    if not name.endswith(EXT):
        return None
    stem = name[:-len(EXT)]
    producer, dash, seq = stem.rpartition("-")
    if not dash or not producer or not seq.isdigit():
        return None
    return producer, int(seq)


_VIOLATION = re.compile(r"frame (.+?) from producer (.+?) does not match \[model\]: (.*?)\n  expected: (.*?)\n"
                        r"  found:    (.*?)\n  fix \(in producer .+?\): (.*)\Z", re.S)


def check_frame(contract, metadata, tensors, frame):
    """Raises FrameContractError unless a frame's metadata and tensors (name -> (safetensors dtype, shape)) match
    the contract (contract_from_env()): the C++ check (spool/frame_contract.cc), its words in the error's fields."""
    from dflash_launch.spool import _native
    header = {k: {"dtype": d, "shape": list(shape)} for k, (d, shape) in tensors.items()}
    header["__metadata__"] = {k: str(v) for k, v in (metadata or {}).items()}
    keys = ("batch", "seq_len", "hidden", "tapped_layers", "dtype", "vocab", "target_layers")
    out = _native.c_void_p()
    r = _native.lib().dfs_check_frame(json.dumps({k: contract[k] for k in keys}).encode(), json.dumps(header).encode(),
                                      frame.encode(), _native.byref(out))
    if r == _native.BAD_FRAME:
        try:
            message = _native.ctypes.string_at(out.value).decode()
        finally:
            _native.lib().dfs_free(out)
        raise FrameContractError(*_VIOLATION.match(message).groups())
    _native.check(r)


def header_layout(data):
    """(metadata, {name: (dtype, shape, begin, end)}) of safetensors bytes (bytes or a mapping; begin/end absolute
    offsets), checked by the C++ reader (spool/safetensors.cc ParseHeader): ValueError saying what is wrong."""
    import ctypes
    from dflash_launch.spool import _native
    buf = (ctypes.c_char * len(data)).from_buffer(data) if not isinstance(data, bytes) else data
    try:
        h = _native.call_json("dfs_parse_header", buf, len(data))
    finally:
        del buf
    meta = h.pop("__metadata__")
    return meta, {k: (v["dtype"], v["shape"], v["begin"], v["end"]) for k, v in h.items()}


def parse_header(data):
    """(metadata, {name: (dtype, shape)}) of safetensors bytes (header_layout's checks)."""
    meta, layout = header_layout(data)
    return meta, {k: (v[0], v[1]) for k, v in layout.items()}


def frame_bytes(hidden, tokens, metadata):
    """A frame as safetensors bytes (no checks: see SpoolProducer.publish)."""
    save = require("safetensors.torch", "writing spool frames").save

    return save({"hidden": hidden.contiguous(), "tokens": tokens.contiguous()},
                metadata={k: str(v) for k, v in metadata.items()})


def frame_metadata(contract):
    """The contract part of a frame's metadata (producer and seq are added at publish)."""
    c = contract
    return {"format": FORMAT, "layer_ids": ",".join(str(i) for i in c["tapped_layers"]), "hidden": str(c["hidden"]),
            "layout": "concat", "dtype": c["dtype"], "target_layers": str(c["target_layers"]),
            "vocab": str(c["vocab"])}

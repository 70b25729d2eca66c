"""The spool's frame format: file names, the contract in a frame's metadata and
its check (the consumers' and the producers' alike), safetensors bytes, and the
errors a broken spool or a misfit frame raises (dflash_launch.spool says how
the parts fit together)."""

import json
import struct

from dflash_launch import HiddenStateContractError, check_hidden_shape, shape_string
from dflash_launch._extras import require

FORMAT = "dflash-frame/1"
WEIGHTS_FORMAT = "dflash-weights/1"
EXT = ".safetensors"
#: A consumer that meets a frame violating the contract exits with this (EX_DATAERR): common/exit_codes.h's
#: kFrameContract (tests/test_exit_codes.py checks they agree). FrameContractError carries it as `exit_code`;
#: dflash_launch/exit_codes.py turns it into the process's exit status where the process opted in.
EXIT_FRAME_CONTRACT = 65

_ST_DTYPES = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}


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


# The contract check is dflash_launch.check_hidden_shape (the words of contract/shape_contract.cc, pinned by
# tests/fixtures/shape_errors.json for both languages); frame checks below add frame_contract.cc's words.


def _ints(text):
    try:
        return [int(x) for x in text.split(",")] if text else []
    except ValueError:
        return None


def check_frame(contract, metadata, tensors, frame):
    """Raises FrameContractError unless a frame's metadata and tensors (name ->
    (safetensors dtype, shape)) match the contract (contract_from_env())."""
    c, m = contract, metadata or {}
    producer = m.get("producer") or "(unnamed)"
    taps, hidden = list(c["tapped_layers"]), c["hidden"]
    b, s, n = c["batch"], c["seq_len"], len(taps)

    def fail(*args):
        raise FrameContractError(frame, producer, *args)

    if m.get("format") != FORMAT:
        fail("not a dflash hidden-state frame", f'metadata format = "{FORMAT}"', f'format = "{m.get("format", "")}"',
             "publish with dflash_launch.spool.SpoolProducer or the builtin target")
    if _ints(m.get("layer_ids", "")) != taps:
        want = shape_string(taps)
        fail("tapped layers differ from [model] tapped_layers",
             f"layer ids {want} (id i = output of layer i = HF hidden_states[i+1])",
             f"layer ids [{m.get('layer_ids', '')}]",
             f"tap exactly {want}, concatenated in that order; or, if the producer is right, set "
             f"[model] tapped_layers to its list (every drafter must read the same taps)")
    if m.get("hidden") != str(hidden):
        fail("hidden size differs from [model] hidden", f"hidden = {hidden}", f"hidden = {m.get('hidden', '')}",
             "publish the hidden states of the target [model] describes")
    if "hidden" not in tensors:
        fail('no "hidden" tensor', f'tensors "hidden" {shape_string([b, s, n * hidden])} and "tokens"',
             'no "hidden"', 'publish the concatenated taps as "hidden"')
    h_dtype, h_shape = tensors["hidden"]
    if m.get("layout") != "concat":
        _, expected, _, fix = check_hidden_shape(b, s, n, hidden, [b, s, n, hidden])
        fail("taps stacked on a new axis: the drafter's fc reads them concatenated", expected,
             f'layout = "{m.get("layout", "")}", shape {shape_string(h_shape)}', fix)
    v = check_hidden_shape(b, s, n, hidden, h_shape)
    if v:
        fail(*v)
    want_dtype = _ST_DTYPES.get(c["dtype"], "F32")
    if h_dtype != want_dtype or m.get("dtype") != c["dtype"]:
        fail("dtype differs from [model] dtype", f'{want_dtype} (dtype = "{c["dtype"]}")',
             f'{h_dtype} (metadata dtype = "{m.get("dtype", "")}")',
             f"cast the hidden states to {c['dtype']} before publishing, or set [model] dtype")
    tok = tensors.get("tokens")
    if tok is None or tok[0] != "I64" or list(tok[1]) != [b, s]:
        fail("token ids missing or misshapen", f'"tokens" I64 {shape_string([b, s])}',
             f'"tokens" {tok[0]} {shape_string(tok[1])}' if tok else 'no "tokens"',
             "publish the token ids of each sample with its hidden states, as int64 [batch, seq_len]")


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_MAX_HEADER = 100 << 20  # worker/builtin/safetensors.cc's kMaxHeader


def _kind(x):
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(x), type(x).__name__)


def header_layout(data):
    """(metadata, {name: (dtype, shape, begin, end)}) of safetensors bytes (bytes or
    a mapping; begin/end are absolute offsets), checked as strictly as the C++
    reader (worker/builtin/safetensors.cc ParseHeader): ValueError saying what is
    wrong for anything else (truncated data, a header that is not an object, a
    __metadata__ that is not an object of strings, holes, unknown dtypes)."""
    size = len(data)
    if size < 8:
        raise ValueError(f"not a safetensors file: {size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > _MAX_HEADER or 8 + n > size:
        raise ValueError(f"not a safetensors file: header length {n} does not fit in {size} bytes")
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not a safetensors file: the header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"not a safetensors file: the header is {_kind(header)}, not a JSON object")
    meta = header.pop("__metadata__", None)
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise ValueError(f"__metadata__ is {_kind(meta)}, not an object")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise ValueError(f"__metadata__.{k} is {_kind(v)}, not a string")
    start, data_size, tensors = 8 + n, size - 8 - n, {}
    for name, e in header.items():
        if not isinstance(e, dict):
            raise ValueError(f"tensor {name}: its entry is {_kind(e)}, not an object")
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
            raise ValueError(f"tensor {name}: dtype {dtype!r} is not one of {', '.join(_ITEMSIZE)}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"tensor {name}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
            raise ValueError(f"tensor {name}: data_offsets {offs!r} are not two byte offsets")
        want = _ITEMSIZE[dtype]
        for d in shape:
            want *= d
        if offs[1] < offs[0] or offs[1] - offs[0] != want or offs[1] > data_size:
            raise ValueError(f"tensor {name}: data_offsets {offs} do not hold dtype x shape = {want} bytes inside "
                             f"{data_size} (a truncated frame?)")
        tensors[name] = (dtype, shape, start + offs[0], start + offs[1])
    at = start
    for name, (_, _, begin, end) in sorted(tensors.items(), key=lambda kv: kv[1][2]):
        if begin != at:
            raise ValueError(f"tensor {name}: the data section has a hole or an overlap at byte {at - start}")
        at = end
    if at != size:
        raise ValueError(f"the data section holds {data_size} bytes, the tensors {at - start}")
    return meta, tensors


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

"""Values and objects written down so that another process can ask for them again (dflash_launch/exact_entries.py
records what a trace read with them): JSON for constants, dtypes, devices and the default process group; a name for
functions; a portable identity for modules, functions and classes."""
import hashlib
import importlib
import sys


class Unportable(Exception):
    """A value that cannot be written down so that another process can ask for it again."""


def default_group():
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_group()


def encode(v, result=False):
    """`v` as JSON that decodes to an equal value. Results that cannot be rebuilt are compared by their repr."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return {"seq": [encode(x, result) for x in v], "tuple": isinstance(v, tuple)}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).replace("torch.", "")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        pg_type = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
        if pg_type is not None and isinstance(v, pg_type.ProcessGroup):
            if v is default_group():
                return {"group": "default"}
            raise Unportable("a process group other than the default one")
    if result:
        return {"repr": repr(v)}
    raise Unportable(f"an argument of type {type(v).__name__}")


def decode(j):
    if not isinstance(j, dict):
        return j
    if "seq" in j:
        seq = [decode(x) for x in j["seq"]]
        return tuple(seq) if j["tuple"] else seq
    import torch
    if "dtype" in j:
        return getattr(torch, j["dtype"])
    if "device" in j:
        return torch.device(j["device"])
    if j.get("group") == "default":
        group = default_group()
        if group is None:
            raise Unportable("no default process group in this process")
        return group
    raise Unportable(f"cannot rebuild {j}")


def qualified(fn) -> str:
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


def resolve(name: str):
    """The function `module.qual.name` names, as qualified() wrote it."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise Unportable(f"cannot find {name}")


def identity(obj):
    """What names `obj` in any process: a module by its name, a function by its code, a class by its qualname;
    other objects by their type (their contents have value guards of their own)."""
    import types
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__]
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        digest = hashlib.sha256(code.co_code + repr(code.co_names).encode()).hexdigest()[:16]
        return ["function", qualified(obj), code.co_firstlineno, digest]
    if isinstance(obj, types.MethodType):
        return ["method", identity(obj.__func__), identity(obj.__self__)]
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return ["builtin", qualified(obj)]
    if isinstance(obj, type):
        return ["class", qualified(obj)]
    return ["instance", qualified(type(obj))]

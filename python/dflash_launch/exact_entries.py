"""A shared Dynamo precompile entry runs in a process only where it computes what that process's own trace would.

Dynamo's precompile (torch 2.13) keeps what the leader's trace read of its process only where a guard survives
serialization with the leader's value. Three kinds do not (measured; docs/cachelock.md, "What is exact"):
- constant folds: dist.get_rank(), get_world_size(), a ProcessGroup's or DeviceMesh's rank(), size(),
  torch.cuda.current_device()... bake the leader's answer into the graph with no guard at all;
- values reached through a module (os.environ through `os`, a config module's attribute): the loader rebuilds those
  guards from its own live objects, so the leader's `G['os'].environ._data[b'ROLE_RANK'] == b'0'` comes back as
  `== b'3'` in rank 3, and passes;
- identity guards (ID_MATCH, CLOSURE_MATCH and what derives from them) are dropped: a global that names another
  function in another rank is not checked.

So the process that saves records, per guarded code (keyed by the sha256 of its serialized guards): its value guards
as it built them, its constant folds with their arguments and answers, and a portable identity of each object that a
dropped guard named. The record travels inside the entry file: the entry unpickles through _load_checked(), so a
process without the payload hook checks it too, and a Python without dflash_launch fails the load and traces.
A loading process installs a guarded code only where its rebuilt guards equal the leader's and the identities match;
the folds are asked again on every call, by a guard of their own. Anything else gets a guard that always fails:
Dynamo then traces this process's own code, and the FX-graph cache still shares every graph that comes out the same.
An entry without a record (saved by torch alone) is refused the same way. Installed with the payload hook and by
`import dflash_launch`, in a process that runs with Dynamo's precompile; nothing here raises into torch."""
import hashlib
import json
import os
import pickle
import threading

from dflash_launch import exact_check, portable, precompile_bypass
from dflash_launch._on_import import patch_on_import

FORMAT = "dflash-exact/1"
_GUARDS = "torch._dynamo.guards"
_PACKAGE = "torch._dynamo.package"
_TORCH_VARIABLES = "torch._dynamo.variables.torch"
_SCRIPT_OBJECT = "torch._dynamo.variables.script_object"

# The guard types torch 2.13's precompile drops (guards.py, CheckFunctionManager's guard_filter_fn).
_DROPPED = ("ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION")
# Constant folds that answer the same in every process: nothing to check.
_PURE_FOLDS = {"torch.promote_types", "torch.is_complex", "torch.is_floating_point", "torch._assert",
               "torch.nn._reduction.get_enum"}

_records = {}  # sha256(guards_state) -> what this process's trace read (or what a checked entry it loaded said)
_folds = []  # constant folds since the last guarded code was built: they belong to the next one
_dropped = []  # (source, identity) of the identity guards the guard build in progress dropped
_unsaved = []  # why an entry was not written (a guarded code without a record)
_local = threading.local()  # .pending: (entry, record) the gate's cache just gave; .active: the record install checks


def unsaved() -> list:
    """Why entries this process would have saved were not written (precompile_facts() says the last)."""
    return list(_unsaved)


# -- the leader: what its trace read ------------------------------------------------------------------------------

def _constant(vt):
    """The Python value a VariableTracker stands for, or raise portable.Unportable."""
    real = getattr(getattr(vt, "value", None), "real_obj", None)  # a ProcessGroup as an argument
    if real is not None:
        return real
    if vt.is_python_constant():
        return vt.as_python_constant()
    raise portable.Unportable(f"an argument Dynamo traced ({type(vt).__name__})")


def _note_fold(name, call, args, kwargs, result_vt, owner=None):
    """Records a fold whose answer is a constant (others put a call into the graph, computed at run time)."""
    if name in _PURE_FOLDS:
        return
    try:
        if not result_vt.is_python_constant():
            return
        result = result_vt.as_python_constant()
        entry = {"call": call, "fn": name, "args": [portable.encode(_constant(a)) for a in args],
                 "kwargs": {k: portable.encode(_constant(v)) for k, v in kwargs.items()},
                 "result": portable.encode(result, result=True)}
        if call == "method":
            entry["self"] = portable.encode(owner)
    except portable.Unportable as e:
        entry = {"call": call, "fn": name, "unportable": str(e)}
    except Exception as e:  # noqa: BLE001 -- a value Dynamo cannot give us: nothing to ask again
        entry = {"call": call, "fn": name, "unportable": f"{type(e).__name__}: {e}"}
    _folds.append(entry)


def _patch_torch_variables(module) -> None:
    cls = module.TorchInGraphFunctionVariable
    if getattr(cls.call_function, "dflash_exact", False):
        return
    watched = set(module.constant_fold_functions) | set(module.constant_fold_functions_need_guards)
    try:
        from torch.distributed import distributed_c10d as c10d
        watched |= {getattr(c10d, n) for n in ("get_rank", "get_world_size", "get_process_group_ranks",
                                                "_get_group_size_by_name", "_get_group_tag", "_rank_not_in_group",
                                                "_resolve_group_name_by_ranks_and_tag") if hasattr(c10d, n)}
    except ImportError:
        pass
    watched_ids = {id(f) for f in watched}
    original = cls.call_function

    def call_function(self, tx, args, kwargs):
        result = original(self, tx, args, kwargs)
        if id(self.value) in watched_ids:
            _note_fold(portable.qualified(self.value), "function", args, kwargs, result)
        return result
    call_function.dflash_exact = True
    cls.call_function = call_function


def _patch_script_object(module) -> None:
    cls = module.TorchScriptObjectVariable
    if getattr(cls.call_method, "dflash_exact", False):
        return
    original = cls.call_method

    def call_method(self, tx, name, args, kwargs):
        result = original(self, tx, name, args, kwargs)
        try:
            real = self.as_python_constant()  # a ProcessGroup, a DeviceMesh: USE_REAL members run at trace time
        except Exception:  # noqa: BLE001 -- no real object: Dynamo put the call into the graph
            return result
        _note_fold(f"{portable.qualified(type(real))}.{name}", "method", args, kwargs, result, owner=real)
        return result
    call_method.dflash_exact = True
    cls.call_method = call_method


def _patch_guards(module) -> None:
    cfm = module.CheckFunctionManager
    if getattr(cfm.__init__, "dflash_exact", False):
        return
    original_init, original_entry = cfm.__init__, module.make_guard_filter_entry

    def make_guard_filter_entry(guard, builder):
        entry = original_entry(guard, builder)
        if entry.has_value and (entry.guard_type in _DROPPED or
                                any(t in ("ID_MATCH", "DICT_VERSION") for t in entry.derived_guard_types)):
            _dropped.append((guard.name, portable.identity(entry.value)))
        return entry

    def __init__(self, *args, **kwargs):
        _dropped.clear()
        original_init(self, *args, **kwargs)
        state = getattr(self, "guards_state", None)
        if state:  # a guarded code this process traced and will save
            key = hashlib.sha256(state).hexdigest()
            record = _records.setdefault(key, {"parts": exact_check.value_parts(self.guard_manager), "folds": [], "ids": []})
            for fold in _folds:
                if fold not in record["folds"]:
                    record["folds"].append(fold)
            for source, ident in _dropped:
                if [source, ident] not in record["ids"]:
                    record["ids"].append([source, ident])
            _folds.clear()
        _dropped.clear()
    __init__.dflash_exact = True
    cfm.__init__ = __init__
    module.make_guard_filter_entry = make_guard_filter_entry


# -- the entry file: the record inside, so that whoever unpickles it checks --------------------------------------

class _Checked:
    """Pickles as a call of _load_checked() with the record and the entry torch wrote."""

    def __init__(self, entry, record):
        self.entry, self.record = entry, record

    def __reduce__(self):
        return _load_checked, (FORMAT, json.dumps(self.record, sort_keys=True), pickle.dumps(self.entry))


def _guards_states(entry):
    """The serialized guards of every guarded code of a PrecompileCacheEntry that a loader installs (a bypassed
    code is never installed: dflash_launch/precompile_bypass.py)."""
    return [g.guards_state for code in entry.dynamo.codes if not getattr(code, "bypassed", False)
            for g in code.guarded_codes]


def _record_for(entry):
    """{sha256(guards_state): record} for the entry, or why it is not worth writing."""
    record, states = {}, _guards_states(entry)
    if not states:  # every frame bypassed: nothing a loader would install
        reasons = precompile_bypass.bypasses()
        return None, f"Dynamo could not serialise a compiled frame ({reasons[0] if reasons else 'nothing to install'})"
    for state in states:
        key = hashlib.sha256(state).hexdigest()
        if key not in _records:
            return None, ("a guarded code was traced before dflash-launch's exactness recorder was installed "
                          "(import torch after the payload hook, or dflash_launch before torch.compile)")
        record[key] = _records[key]
    return record, ""


def _load_checked(fmt, record_json, entry_bytes):
    """What an entry file saved here unpickles through: the checks are installed before torch installs the entry."""
    install()
    _install_retrace_fix()
    entry = pickle.loads(entry_bytes)
    try:
        record = json.loads(record_json) if fmt == FORMAT else None
    except ValueError:
        record = None
    _local.pending = (entry, record if isinstance(record, dict) else {})
    return entry


def _install_retrace_fix():
    # A refused guarded code makes Dynamo trace where a loaded entry installed its globals (dflash_launch/retrace_fix.py).
    from dflash_launch import retrace_fix
    retrace_fix.install(force=True)


_NO_RECORD = object()


def _patch_package(module) -> None:
    if getattr(module.load_guard_manager, "dflash_exact", False):
        return
    original_state, original_manager = module.load_guards_state, module.load_guard_manager
    original_install, original_write = module.CompilePackage.install, module.DiskDynamoStore.write
    original_load = module.DiskDynamoCache.load

    def load_guards_state(data):
        state = original_state(data)
        try:
            state.dflash_key = hashlib.sha256(data).hexdigest()
        except Exception:  # noqa: BLE001 -- no attribute: the check says it cannot tell
            pass
        return state

    def load_guard_manager(guards_state, target_code, runtime_global_scope):
        manager = original_manager(guards_state, target_code, runtime_global_scope)
        record = getattr(_local, "active", None)
        if record is not None:  # an entry of the gate's: exact here, or refused
            key, record = getattr(guards_state, "dflash_key", ""), record if record is not _NO_RECORD else {}
            if exact_check.check(manager, key, runtime_global_scope, record):
                _records.setdefault(key, record[key])  # exact here: a save from this process may carry it on
        return manager

    def install(self, backends):
        # The record of the entry the gate's cache just gave (load() below, or _load_checked where the checks came
        # with the entry), if it is the one this package holds; any other install is not ours to judge.
        entry, record = getattr(_local, "pending", None) or (None, None)
        _local.pending = None
        codes = getattr(getattr(entry, "dynamo", None), "codes", None) or [None]
        ours = any(code is codes[0] for code in getattr(self, "_codes", {}).values())
        _local.active = record if ours else None
        try:
            return original_install(self, backends)
        finally:
            _local.active = None

    def load(self, fn):
        _local.pending = None
        result = original_load(self, fn)
        pending = getattr(_local, "pending", None)
        if result is not None and (pending is None or pending[0] is not result):
            _local.pending = (result, _NO_RECORD)  # torch's own format in the gate's cache: nothing says what it read
        return result

    def write(self, cache_entry, path):
        record, why = _record_for(cache_entry)
        if record is None:
            if why not in _unsaved:
                _unsaved.append(why)
            return None
        return original_write(self, _Checked(cache_entry, record), path)

    for f in (load_guards_state, load_guard_manager, install, load, write):
        f.dflash_exact = True
    module.load_guards_state, module.load_guard_manager = load_guards_state, load_guard_manager
    module.CompilePackage.install = install
    module.DiskDynamoCache.load = load
    module.DiskDynamoStore.write = write


_SYMBOLIC_CONVERT = "torch._dynamo.symbolic_convert"


def _patch_symbolic_convert(module) -> None:
    # Dynamo installs no guard on what it reads through a stdlib module's globals ("users don't mutate stdlib
    # attributes"): os.getenv("RANK") reads os.environ from os's own globals and bakes the leader's value in with no
    # guard at all. os.environ is per process: its reads are guarded like any other global's here.
    original = module.is_stdlib
    if getattr(original, "dflash_exact", False):
        return

    def is_stdlib(mod):
        return mod is not os and original(mod)
    is_stdlib.dflash_exact = True
    module.is_stdlib = is_stdlib


_broken = []  # why a patch could not be made (another torch): Dynamo's precompile is then off in this process


def broken() -> list:
    """Why exactness could not be set up here; precompile_facts() says it, and nothing is saved or loaded."""
    return list(_broken)


def _precompile_off(module) -> None:
    module.caching_precompile = False


def _safely(patch):
    """`patch`, or, where this torch is not the one it was written for, Dynamo's precompile off in this process:
    without the recorder and the checks a shared entry cannot be shown exact, so none is saved or loaded."""
    def guarded(module):
        try:
            patch(module)
        except Exception as e:  # noqa: BLE001 -- never into the payload's import of torch
            why = f"exactness checks unavailable on torch's {module.__name__} ({type(e).__name__}: {e})"
            if why not in _broken:
                _broken.append(why)
            patch_on_import("torch._dynamo.config", _precompile_off)
    guarded.__name__ = patch.__name__
    return guarded


_PATCHES = {}


def install() -> None:
    """Records what traces read and checks what loads; idempotent, and each patch waits for its module's import."""
    if not _PATCHES:
        _PATCHES.update({name: _safely(patch) for name, patch in (
            (_GUARDS, _patch_guards), (_SYMBOLIC_CONVERT, _patch_symbolic_convert),
            (_TORCH_VARIABLES, _patch_torch_variables), (_SCRIPT_OBJECT, _patch_script_object),
            (_PACKAGE, _patch_package))})
    for name, patch in _PATCHES.items():
        patch_on_import(name, patch)
    precompile_bypass.install()  # and what it cannot save is a bypass, said once, never a crash

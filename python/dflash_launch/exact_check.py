"""The loader's side of dflash_launch/exact_entries.py: whether one guarded code of a loaded precompile entry is exact
in this process. Its rebuilt guards must read as the leader's did (value_parts), the globals a dropped identity guard
named must be the same objects here, and the constant folds are asked again on every call by a guard of their own;
anything else gets a guard that always fails, and the process says why (dflash_launch.refused_entries)."""
import json
import re

from dflash_launch import portable

_ID_NUMBER = re.compile(r"(___check_\w+\(.*?), \d+\)")  # ___check_type_id(x, 9406...), ___check_obj_id, ...


def value_parts(manager) -> list:
    """The leaf guards of a guard tree as code, sorted, with the per-process ids of type and object checks blanked:
    what the trace read, in the values it read them. Relational guards (no aliasing between inputs) are left out:
    they relate a call's inputs to each other, read nothing of the process, and a rebuild lists them otherwise."""
    from torch._C._dynamo.guards import RelationalGuard
    parts = set()

    def visit(mgr):
        for guard in mgr.get_leaf_guards():
            if isinstance(guard, RelationalGuard):
                continue
            for part in guard.verbose_code_parts():
                parts.add(_ID_NUMBER.sub(r"\1, ID)", part.split("#")[0].rstrip()))
        for child in mgr.get_child_managers():
            visit(child)
    visit(manager.root)
    epilogue = getattr(manager.root, "get_epilogue_lambda_guards", None)
    for guard in (epilogue() if epilogue else []):
        for part in guard.verbose_code_parts():
            parts.add(part.split("#")[0].rstrip())
    return sorted(parts)



def _asker(fold):
    """A function that asks `fold` again in this process and returns its answer, encoded as the record encodes it.
    The function is found once; the arguments are rebuilt on each call (the default group may come later)."""
    if "unportable" in fold:
        raise portable.Unportable(fold["unportable"])
    method = fold["fn"].rsplit(".", 1)[-1]
    fn = None if fold["call"] == "method" else portable.resolve(fold["fn"])

    def ask():
        args = [portable.decode(a) for a in fold["args"]]
        kwargs = {k: portable.decode(v) for k, v in fold["kwargs"].items()}
        call = fn or getattr(portable.decode(fold["self"]), method)
        return portable.encode(call(*args, **kwargs), result=True)
    return ask


def _closure_vars():
    """The helpers Dynamo's guard sources call (___odict_getitem and the like)."""
    from torch._dynamo import guards
    return guards._get_closure_vars() if hasattr(guards, "_get_closure_vars") else guards.CLOSURE_VARS


def _scope_value(source, scope):
    return eval(source, dict(scope), _closure_vars())  # noqa: S307 -- Dynamo's own guard source, evaluated as Dynamo does


def _subject(part: str) -> str:
    """What a guard's code is about: `x` of `x == 3` and of `___check_type_id(x, ID), type=...`."""
    m = re.match(r"___check_\w+\((.*), ID\)", part)
    return m.group(1) if m else part.split(" == ")[0]


def _first_difference(leader, here) -> str:
    ours = sorted(set(here) - set(leader))
    theirs = sorted(set(leader) - set(here))
    if not ours and not theirs:
        return ""
    if ours:
        was = next((t for t in theirs if _subject(t) == _subject(ours[0])), None)
        return f"the leader's trace read {was}; here {ours[0]}" if was else f"here {ours[0]}, not in the leader's trace"
    return f"the leader's trace read {theirs[0]}; not so here"


def _describe(fold, answer="") -> str:
    call = fold["fn"] + "()"
    if "unportable" in fold:
        return f"the leader's trace baked in {call} on {fold['unportable']}, which this process cannot ask again"
    return f"the leader's trace baked in {call} = {_show(fold['result'])}" + (f"; here {answer}" if answer else "")


def _show(encoded) -> str:
    try:
        return repr(portable.decode(encoded)) if not (isinstance(encoded, dict) and "repr" in encoded) else encoded["repr"]
    except Exception:  # noqa: BLE001
        return json.dumps(encoded)


def _verdict(record, state_key, manager, global_scope):
    """Why the guarded code is not exact here ("" when it is), and the checks left for call time."""
    rec = record.get(state_key) if isinstance(record, dict) else None
    if not isinstance(rec, dict):
        return "no record of what the leader's trace read (an entry torch saved without dflash-launch)", None
    why = _first_difference(rec.get("parts", []), value_parts(manager))
    if why:
        return why, None
    at_call = []
    for source, ident in rec.get("ids", []):
        if source.startswith("G["):
            try:
                here = portable.identity(_scope_value(source, {"G": global_scope}))
            except Exception:  # noqa: BLE001 -- gone here: not the leader's object
                here = None
            if here != ident:
                return f"the leader's trace used {source} = {ident}; here {here}", None
        else:
            at_call.append(("id", source, ident))
    for fold in rec.get("folds", []):
        if "unportable" in fold:
            return _describe(fold), None
        at_call.append(("fold", fold))
    return "", at_call


def _call_time_guard(checks):
    """One guard that, on every call, asks the recorded folds again and checks the identities of locals."""
    closure_vars, tests = _closure_vars(), []
    for kind, *what in checks:
        if kind == "id":
            source, ident = what
            code = compile(source, "<dflash-exact>", "eval")

            def test(frame_locals, source=source, ident=ident, code=code):
                here = portable.identity(eval(code, {"L": frame_locals}, closure_vars))  # noqa: S307 -- a guard source
                return "" if here == ident else f"the leader's trace used {source} = {ident}; here {here}"
        else:
            (fold,) = what
            ask = _asker(fold)

            def test(_locals, fold=fold, ask=ask):
                answer = ask()
                return "" if answer == fold["result"] else _describe(fold, _show(answer))
        tests.append(test)

    def guard(frame_locals):
        for test in tests:
            try:
                why = test(frame_locals)
            except Exception as e:  # noqa: BLE001 -- cannot ask here: this process traces its own code
                why = f"a check of the leader's trace cannot be made here ({type(e).__name__}: {e})"
            if why:
                return _note_refusal(why)
        return True
    parts = [f"dflash-launch: {c[1]} is {c[2]}" if c[0] == "id" else _describe(c[1]) for c in checks]
    return guard, parts


def _note_refusal(why: str) -> bool:
    """Says (once) why a loaded guarded code does not run here; False, for the guard that found it."""
    import dflash_launch
    reason = f"dynamo cache entry not exact for this process ({why}): traced with the FX-graph cache"
    if reason not in dflash_launch.refused_entries:
        dflash_launch.refused_entries.append(reason)
    return False


def refuse(manager, why: str) -> None:
    manager.root.add_lambda_guard(lambda _locals: False, [f"dflash-launch: not exact for this process: {why}"], None)
    _note_refusal(why)


def check(manager, state_key, global_scope, record) -> bool:
    try:
        why, at_call = _verdict(record, state_key, manager, global_scope)
        if not why and at_call:
            guard, parts = _call_time_guard(at_call)
            manager.root.add_lambda_guard(guard, parts, None)
    except Exception as e:  # noqa: BLE001 -- cannot tell: not exact
        why = f"cannot check it ({type(e).__name__}: {e})"
    if why:
        refuse(manager, why)
        return False
    return True

"""Dynamo's precompile, never fatal and quiet where it cannot save (issue #39).

- torch 2.13 kills the payload where it cannot serialise a frame's guards: a guard on an object whose class is
  defined in a local scope raises a TypeError out of CheckFunctionManager.serialize_guards (InternalTorchDynamoError),
  and its own bypass for the others (a PackageError) leaves no guards state, which convert_frame then asserts it has.
  Here any error of that serialisation bypasses the frame's entry: it is not saved, and the payload runs on as
  without precompile (torch's strict_precompile still raises).
- torch warns once per dropped identity guard ("ID_MATCH guard on ... is dropped with caching_precompile=True":
  41 lines per process for SpecForge's drafter, which then saved nothing). dflash_launch/exact_entries.py records
  and checks those identities itself, so the lines are not shown. Its "Detected a package bypass: <why>" warnings
  are kept here instead; a leader that saved nothing says so once, with the first reason (precompile_facts()).
Installed with dflash_launch/exact_entries.py."""
import logging

from dflash_launch._on_import import patch_on_import

_GUARDS = "torch._dynamo.guards"
_DROPPED = "guard on %s is dropped with caching_precompile"
_BYPASS = "Detected a package bypass"
_bypasses = []  # why Dynamo saved a frame of this process nowhere, in order, each once


def bypasses() -> list:
    """Why frames compiled here were left out of the precompile entry."""
    return list(_bypasses)


class _QuietPrecompile(logging.Filter):
    """Drops torch's per-guard "dropped" warnings and keeps its bypass reasons for precompile_facts()."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if _DROPPED in msg:
            return False
        if msg.startswith(_BYPASS):
            reason = str(record.args[0]) if record.args else record.getMessage()
            if reason not in _bypasses:
                _bypasses.append(reason)
            return False
        return True


def _patch_guards(module) -> None:
    cfm = getattr(module, "CheckFunctionManager", None)
    if cfm is None or not hasattr(cfm, "serialize_guards"):
        return  # another torch: its own behaviour stands
    if getattr(cfm.serialize_guards, "dflash_bypass", False):
        return
    original = cfm.serialize_guards

    def serialize_guards(self, builder, sorted_guards, output_graph):
        try:
            return original(self, builder, sorted_guards, output_graph)
        except Exception as e:  # noqa: BLE001 -- what torch cannot save is a bypass, not the payload's death
            import torch._dynamo.config
            if torch._dynamo.config.strict_precompile:
                raise
            # torch 2.13's own bypass (a PackageError) leaves guards_state None, and convert_frame then asserts
            # it is not: the frame's entry is bypassed here, and the empty state is never stored (add_guarded_code
            # returns early for a bypassed entry).
            output_graph.bypass_package(f"{type(e).__name__}: {e}")
            return b""
    serialize_guards.dflash_bypass = True
    cfm.serialize_guards = serialize_guards


_FILTER = _QuietPrecompile()


def install() -> None:
    for name in (_GUARDS, "torch._dynamo.output_graph"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    patch_on_import(_GUARDS, _patch_guards)

"""Dynamo's precompile artifact for payloads that do not call the helper: the gate's leader saves it inside its
first compiled step, and every gated process reports what it did, with no change to the user's script.

Installed by `import dflash_launch`, and at interpreter start by `dflash_launch_hook.pth` (in site-packages with
the package) in a process the launcher gated (DFLASH_GATE_ROLE or DFLASH_WARMUP=1 in its environment;
`DFLASH_PAYLOAD_HOOK=0` opts out). A .pth file shadows nothing, unlike a `sitecustomize` pushed in through PYTHONPATH, and reaches every Python of the
payload's tree: `python train.py`, `torchrun`'s ranks, a shell script's `python -c`. Why this and not the READY
moment: the payload may say READY with its own socket code, `systemd-notify` or a log line, none of which passes
through us; a compile's end does, in every process (docs/cachelock.md, "Who saves").

- `import dflash_launch`: the ISA verdicts (isa_verdict) and the re-trace fix (retrace_fix), as for the helper.
- A leader (or warm-up) saves the artifact once a graph is whole: an inference graph when Dynamo records its
  frame (DynamoCache.record_package, right after the frame's compile), a training graph at the end of its lazy
  backward's compile (Dynamo's end-of-compile callback, torch._dynamo.callback). So it is on disk before the
  payload's first step returns, and so before whatever READY it sends. Every gated process sends its precompile
  facts (X_DFLASH_GATE_PRECOMPILE*, no READY=1) to $NOTIFY_SOCKET, where dflash-worker or the supervisor keeps
  the latest until READY.
- A follower whose entry loads compiles nothing: it reports once the load returned (DynamoCache.load, at its
  `torch.compile()`). One that compiles after all (a guard failed, the entry did not install) reports again at
  that compile's end, as not precompiled. An entry with collectives inside its graph is not loaded (below).
Nothing here raises into torch: a failure is a fact to report, and the compile goes on."""
import os
import sys

import dflash_launch
from dflash_launch import exact_entries
from dflash_launch._on_import import patch_on_import

_CALLBACK = "torch._dynamo.callback"
_PACKAGE = "torch._dynamo.package"
PROBE = "probe"  # DFLASH_GATE_ROLE the launcher's plan-time question sets: "does the hook load in this Python?"


def report() -> bool:
    """Sends this process's precompile facts (a leader saves first: precompile_facts()) without READY=1."""
    try:
        lines = dflash_launch.precompile_lines()
        return bool(lines) and dflash_launch.notify("\n".join(lines))
    except Exception as e:  # noqa: BLE001 -- a report, never a failure of the compile it follows
        print(f"dflash_launch: precompile facts not reported ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return False


def _complete_graphs() -> int:
    """AOTAutograd entries this process has whole: saved after a miss (a training graph's only once its lazy
    backward compiled) or loaded on a hit."""
    from torch._dynamo.utils import counters
    aot = counters["aot_autograd"]
    return int(aot["autograd_cache_saved"]) + int(aot["autograd_cache_hit"])


_saved_at = [0]  # _complete_graphs() at the leader's last save


def _leads() -> bool:
    return dflash_launch.gate_role() == "lead" or dflash_launch.is_warmup()


def _save_if_a_graph_became_whole() -> None:
    # A save between a training graph's forward and its lazy backward spoils the entry for good in torch 2.13: a
    # later save does not mend it, and followers load it and then compile (measured: a DDP step, 2 FX-graph
    # lookups each). So the leader saves only when a graph became whole, and frames without a graph save nothing.
    try:
        complete = _complete_graphs()
    except Exception:  # noqa: BLE001 -- a torch without these counters: nothing to go by, no save
        return
    if complete != _saved_at[0]:
        _saved_at[0] = complete
        report()


def _on_compile_end(args) -> None:
    if not _leads():
        report()
    elif getattr(args.callback_trigger, "name", "") == "LAZY_BACKWARD":  # a frame's own end: record_package below
        _save_if_a_graph_became_whole()


def _register_callback(module) -> None:
    handler = module.callback_handler
    if _on_compile_end not in handler.end_callbacks:
        handler.register_end_callback(_on_compile_end)


# Functional collectives inside a compiled graph (all_gather_tensor & co.) put the world in its shapes and its
# process group. Dynamo's precompile drops the guards that would tell worlds apart (ID_MATCH on the group), and
# the gate's warm-up compiles in a world of one or a fake one: such an entry, loaded by a real rank, runs the
# warm-up's world (measured: Gloo's "invalid size of output tensor"). Those ranks trace, as without precompile.
_COLLECTIVES = b"_c10d_functional"


def _has_collectives(module, cache, fn) -> bool:
    try:
        key = module.CompilePackage.source_id_from_fn(fn)
        with open(os.path.join(cache.path_prefix(), key, "entry"), "rb") as f:
            return _COLLECTIVES in f.read()
    except Exception:  # noqa: BLE001 -- unreadable: Dynamo's own load says what went wrong
        return False


def _patch_package(module) -> None:
    cls = getattr(module, "DiskDynamoCache", None)
    if cls is None or getattr(cls.load, "dflash_wrapped", False):
        return
    original_load, original_record = cls.load, cls.record_package

    def load(self, fn):
        entry = original_load(self, fn)
        if entry is not None and _has_collectives(module, self, fn):
            entry = None
            dflash_launch.refused_entries.append(
                "dynamo cache entry not loaded: its graph has collectives inside, compiled in the warm-up's world "
                "(Dynamo's precompile drops the process-group guards): traced with the FX-graph cache")
        if not _leads():  # a leader's facts come with its save
            report()
        return entry

    def record_package(self, package):
        # Dynamo records a frame's entry here, after the frame's compile ended: an inference graph is whole now.
        original_record(self, package)
        if _leads():
            _save_if_a_graph_became_whole()
    load.dflash_wrapped = record_package.dflash_wrapped = True
    cls.load, cls.record_package = load, record_package


def install() -> None:
    """A no-op outside a gated process that runs with Dynamo's precompile cache, and for the launcher's probe."""
    if dflash_launch.gate_role() == PROBE or os.environ.get("DFLASH_PAYLOAD_HOOK") == "0":
        return
    if dflash_launch.gate_role() not in ("lead", "reuse") and not dflash_launch.is_warmup():
        return
    if os.environ.get("TORCH_CACHING_PRECOMPILE") != "1":
        return
    exact_entries.install()  # before our load wrapper: what a trace reads is recorded, what loads is checked
    patch_on_import(_CALLBACK, _register_callback)
    patch_on_import(_PACKAGE, _patch_package)


install()

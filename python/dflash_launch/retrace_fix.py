"""A follower whose loaded precompile entry fails a guard re-traces instead of crashing (torch 2.13 bug).

With `caching_precompile`, loading a Dynamo entry installs the globals its bytecode uses into the function's
module, under the names the *leader's* process minted (`__builtins_dict___0`, from a per-process counter). When a
guard of that entry then fails in this process (another `torch.get_num_threads()`, grad mode, an edit that kept
the function's qualname and first line), Dynamo re-traces, mints the same name from its own counter, and dies:
`AssertionError: Name '__builtins_dict___0' already exists in scope`, where it should have recompiled. Pinned by
tests/test_precompile_helper.py with torch alone.

The fix: `OutputGraph.install_global` draws names until one is free in the frame's globals. It changes nothing
unless the name it would have used is taken, which is exactly the crash, and a follower that took that path is
not reported as precompiled (precompile_facts()). Installed by
`import dflash_launch` in a process that runs with `TORCH_CACHING_PRECOMPILE=1`; `DFLASH_RETRACE_FIX=0` leaves
torch untouched. docs/cachelock.md, "Dynamo's precompile artifact"."""
import os

from dflash_launch._on_import import patch_on_import

_OUTPUT_GRAPH = "torch._dynamo.output_graph"
_seen = {"names_skipped": 0}


def stats() -> dict:
    """How often a taken name was skipped: the crash this module avoids."""
    return dict(_seen)


def _patch_output_graph(module) -> None:
    cls = module.OutputGraph
    if getattr(cls.install_global, "dflash_wrapped", False):
        return
    from torch._dynamo.bytecode_transformation import unique_id

    def install_global(self, prefix, value):
        name = unique_id(prefix)
        while name in self.global_scope:  # minted by another process: the entry we loaded installed it
            _seen["names_skipped"] += 1
            name = unique_id(prefix)
        self.install_global_unsafe(name, value)
        return name
    install_global.dflash_wrapped = True
    cls.install_global = install_global


def install(force: bool = False) -> None:
    """Called by `import dflash_launch`: a no-op unless this process runs with Dynamo's precompile cache (or
    `force`: it loaded an entry of the gate's, dflash_launch/exact_entries.py)."""
    if os.environ.get("DFLASH_RETRACE_FIX") == "0":
        return
    if not force and os.environ.get("TORCH_CACHING_PRECOMPILE") != "1":
        return
    patch_on_import(_OUTPUT_GRAPH, _patch_output_graph)

"""Patch a torch module right after it is imported: torch imports its compiler modules lazily, and a payload
may import dflash_launch before torch. Used by isa_verdict (the ISA probe) and retrace_fix (a torch 2.13 bug)."""
import importlib.machinery
import sys


class _PatchOnImport:
    """A meta-path finder that runs `patch(module)` once `name` has been executed (its loader's exec_module)."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module):
            exec_module(module)
            patch(module)
        spec.loader.exec_module = exec_and_patch
        return spec


def patch_on_import(name, patch) -> None:
    """Runs `patch(module)` now if `name` is imported, else right after its import. `patch` must be idempotent."""
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _PatchOnImport) and f.name == name and f.patch is patch for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(name, patch))

"""Patch a torch module right after it is imported: torch imports its compiler modules lazily, and a payload
may import dflash_launch before torch. Used by isa_verdict (the ISA probe)."""
import importlib.machinery
import sys


class _PatchOnImport:
    """A meta-path finder that runs each of `patches` on module `name` once it has been executed (its loader's
    exec_module). One finder per name: the first finder that answers a name is the only one asked."""

    def __init__(self, name):
        self.name, self.patches = name, []

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patches = spec.loader.exec_module, self.patches

        def exec_and_patch(module):
            exec_module(module)
            for patch in list(patches):
                patch(module)
        spec.loader.exec_module = exec_and_patch
        return spec


def patch_on_import(name, patch) -> None:
    """Runs `patch(module)` now if `name` is imported, else right after its import. `patch` must be idempotent."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _PatchOnImport) and f.name == name), None)
    if finder is None:
        finder = _PatchOnImport(name)
        sys.meta_path.insert(0, finder)
    if patch not in finder.patches:
        finder.patches.append(patch)

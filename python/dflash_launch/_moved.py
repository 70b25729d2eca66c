"""The old names of the modules that moved into subpackages (issue #48: dflash_launch.spool_world is now
dflash_launch.spool.world). Each old name is a file that calls moved_to: it warns (DeprecationWarning, at the
importer's line, so Python shows it for a script's own imports) and makes the old name the new module itself, so
`from old import X`, `old.X`, isinstance and the module's state are the new module's. Kept for one release after the
move (0.1.x); MOVED lists them, tests/test_moved_modules.py checks every rename in git's history has one."""
import importlib
import sys
import warnings

# old name -> new name
MOVED = {
    # issue #56: the protocol went into libdflash_spool.so; what users imported from these is the package's (first:
    # the older names below import them)
    "dflash_launch.spool.order": "dflash_launch.spool",
    "dflash_launch.spool.ring": "dflash_launch.spool",
    "dflash_launch.spool.write": "dflash_launch.spool",
    "dflash_launch.isa_verdict": "dflash_launch.inductor.isa_verdict",
    "dflash_launch._on_import": "dflash_launch.inductor.on_import",
    "dflash_launch.hf_target": "dflash_launch.roles.hf_target",
    "dflash_launch.pipeline_twin": "dflash_launch.roles.pipeline_twin",
    "dflash_launch.reference_drafter": "dflash_launch.roles.reference_drafter",
    "dflash_launch.spool_dirs": "dflash_launch.spool.dirs",
    "dflash_launch.spool_format": "dflash_launch.spool.format",
    "dflash_launch.spool_mapped": "dflash_launch.spool.mapped",
    "dflash_launch.spool_order": "dflash_launch.spool.order",
    "dflash_launch.spool_producer": "dflash_launch.spool.producer",
    "dflash_launch.spool_source": "dflash_launch.spool.source",
    "dflash_launch.spool_warmup": "dflash_launch.spool.warmup",
    "dflash_launch.spool_world": "dflash_launch.spool.world",
    "dflash_launch.spool_write": "dflash_launch.spool.write",
    "dflash_launch.demo_report": "dflash_launch.tools.demo_report",
    "dflash_launch.gpu_check": "dflash_launch.tools.gpu_check",
    "dflash_launch.spool_pin_check": "dflash_launch.tools.spool_pin_check",
    "dflash_launch.starter": "dflash_launch.tools.starter",
}


def moved_to(old, new):
    """Called by the module `old` as it is imported: warns, and `old` becomes the module `new`."""
    # stacklevel 3: past this function and the old module's body, at the importer's line (the import
    # machinery's frames are skipped by warnings itself).
    warnings.warn(f"{old} moved to {new}: import that; the old name goes after dflash-launch 0.1",
                  DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module

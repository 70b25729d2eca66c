"""Optional dependencies, imported where a function needs them, with an error that names the extra.

The package's core (notify, the gate-role and warm-up helpers, the spool's file protocol, the console
entry points) is standard library only. Three extras (pyproject.toml) declare the rest:

- ``dflash-launch[torch]``: torch and safetensors, for the shape check on tensors, init_process_group,
  the spool's tensor frames, the reference drafter and the GPU check. Skip it when the venv already
  holds the torch you train with: nothing else is needed.
- ``dflash-launch[demo]``: the above plus matplotlib, for the demo's report plot.
- ``dflash-launch[hf]``: torch, safetensors and transformers, for the ready-made target dflash_launch.roles.hf_target.
"""
import importlib

# Top-level module -> the extra that installs it.
EXTRA_OF = {"torch": "torch", "safetensors": "torch", "matplotlib": "demo", "transformers": "hf"}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, what: str):
    """`module`, imported; MissingExtraError naming the extra if it (or what it needs) is missing.
    `what` names the feature that needs it, for the message."""
    top = module.split(".")[0]
    extra = EXTRA_OF[top]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs {top}, which cannot be imported here ({e}): "
            f"pip install 'dflash-launch[{extra}]' (or install {top} into this environment)") from e

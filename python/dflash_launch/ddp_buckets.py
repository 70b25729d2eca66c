"""DDP's gradient buckets across a resume: a resumed world sums its gradients in the layout the run it resumes had,
so DDP's defaults resume bitwise (issue #59 item 7; docs/checkpoints.md, "Bitwise").

DistributedDataParallel starts with one bucket of every parameter in their index order and, after its first step,
rebuilds the buckets in the order the gradients became ready (Reducer::rebuild_buckets). A collective sums an
element in an order that depends on its offset in the bucket (gloo's ring over 3 ranks: (a+b)+c or (b+c)+a), so
a resumed world's first step, in the initial layout, differed in the last bits from the run never stopped, already
rebuilt. A checkpoint records the layout (`layout()`: DDP's own logging data, the same on every rank: the rebuild
takes rank 0's), and restore() builds the resumed DDP's reducer with it (`apply()`) before its first step; its own
rebuild after that step finds the same order (the same model, the same graph) and changes nothing.

DDP has no public call for either, so both use its internals (torch 2.x: `_get_ddp_logging_data`,
`_build_params_for_reducer`, `_ddp_init_helper`); where they are not as expected, or the model carries a comm hook
or mixed precision (its reducer holds those), apply() says why not and leaves the model as it is: exactly once still
holds, the last bits do not (find_unused_parameters=True never rebuilds: bitwise at the cost of a graph walk per
step)."""

import sys


def _ddp(model):
    nn_parallel = sys.modules.get("torch.nn.parallel")
    ddp_class = getattr(nn_parallel, "DistributedDataParallel", None)
    return model if ddp_class is not None and isinstance(model, ddp_class) else None


def _indices(text, sep):
    return [[int(i) for i in part.split()] for part in text.split(sep) if part.strip()]


def layout(model):
    """[[parameter index, ...] per bucket, in the reducer's order] that `model` (a DistributedDataParallel) reduces
    its gradients in from now on: its rebuilt buckets, or after its first step the ones its rebuild will make; None
    for another model, before any step, or with find_unused_parameters=True (it never rebuilds)."""
    ddp = _ddp(model)
    if ddp is None or getattr(ddp, "find_unused_parameters", False) and not getattr(ddp, "static_graph", False):
        return None
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - another torch's internals: no layout, as before
        return None
    if data.get("has_rebuilt_buckets") and data.get("rebuilt_per_bucket_param_indices"):
        return _indices(data["rebuilt_per_bucket_param_indices"], ", ")
    ready = data.get("prev_iteration_grad_ready_order_indices")
    if not ready:
        return None
    return _as_rebuilt(ddp, [int(i) for i in ready.split(",")])


def _as_rebuilt(ddp, ready):
    """The buckets Reducer::rebuild_buckets makes of gradients ready in `ready`'s order (one step, no rebuild yet)."""
    import torch.distributed as dist
    params, sparse = ddp._build_params_for_reducer()
    config = getattr(ddp, "_bucket_config", None)
    if config is None or getattr(config, "has_custom_per_bucket_caps", False):
        return None  # another torch, or caps of the user's: not guessed
    limits = [config.first_bucket_bytes_cap, config.bucket_bytes_cap]
    buckets, _ = dist._compute_bucket_assignment_by_size([params[i] for i in ready], limits,
                                                         [sparse[i] for i in ready], ready)
    return [list(b) for b in buckets]


def apply(model, buckets):
    """Builds the reducer of `model` (a DistributedDataParallel that has not stepped) with `buckets` (a layout()
    of the run it resumes), on every rank alike. Returns None when done or when there is nothing to do (another
    model, no layout recorded, buckets already rebuilt), else why it could not (said by the caller)."""
    ddp = _ddp(model)
    if ddp is None or not buckets or getattr(ddp, "_has_rebuilt_buckets", True):
        return None
    if getattr(ddp, "_comm_hooks", None) or getattr(ddp, "mixed_precision", None) is not None:
        return "its DDP has a comm hook or mixed precision, which a rebuilt reducer would lose"
    import torch.distributed as dist
    try:
        params, sparse = ddp._build_params_for_reducer()
        if sorted(i for b in buckets for i in b) != list(range(len(params))):
            return f"the recorded buckets name other parameters than this model's {len(params)}"
        names = ddp._build_debug_param_to_name_mapping(params)
        assign = dist._compute_bucket_assignment_by_size
        # DDP reverses the assignment's buckets for the reducer (the last parameters' gradients come first).
        dist._compute_bucket_assignment_by_size = lambda *a, **k: ([list(b) for b in reversed(buckets)],
                                                                   [sys.maxsize] * len(buckets))
        try:
            ddp.reducer._remove_autograd_hooks()  # the new reducer's hooks replace them
            ddp._ddp_init_helper(params, sparse, names, ddp.static_graph)
        finally:
            dist._compute_bucket_assignment_by_size = assign
    except (AttributeError, TypeError) as e:
        return f"this torch's DDP is not as dflash_launch.ddp_buckets knows it ({type(e).__name__}: {e})"
    return None

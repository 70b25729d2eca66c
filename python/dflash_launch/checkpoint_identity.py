"""Whose a checkpoint is, and whether a restore of it can be exact (issue #55): the run, role, process, world size,
[model] and spool that wrote it, and the dtype and shape of every tensor it holds. dflash_launch.Checkpoint writes
them to <checkpoint>/identity.json; the builtin drafter writes the same keys into its safetensors metadata
(worker/builtin/checkpoint_identity.h), so both languages refuse and adopt alike (docs/checkpoints.md, "Identity").

A checkpoint of this run (the same run id and role: a restart, or `run --resume`, which keeps the id; the launcher
refuses a used run id without --resume) is restored. Another run's, or one written before checkpoints recorded an
identity, is refused unless DFLASH_CHECKPOINT_ADOPT=1 says to start from it on purpose. Another [model], or tensors
of another dtype or shape, are refused even then: DCP would convert them silently."""

import json
import os

IDENTITY_FILE = "identity.json"
ADOPT_VAR = "DFLASH_CHECKPOINT_ADOPT"
# contract/env_vars.h's [model] variables, in its order.
MODEL_VARS = ("DFLASH_HIDDEN_SHAPE", "DFLASH_TAPPED_LAYERS", "DFLASH_TARGET_LAYERS", "DFLASH_HIDDEN",
              "DFLASH_DRAFT_LAYERS", "DFLASH_BLOCK_SIZE", "DFLASH_SEQ_LEN", "DFLASH_BATCH", "DFLASH_DTYPE",
              "DFLASH_VOCAB", "DFLASH_SEED", "DFLASH_HEADS", "DFLASH_KV_HEADS")
_ON_PURPOSE = f"to start from its state on purpose: {ADOPT_VAR}=1 in the role's env"
_ELSEWHERE = "or give this run another [run] checkpoint_dir"
SHOWN = 8  # frames or tensors a message names before "and N more"


def identity_of(env, world, spool, tensors):
    """This process's identity: the run's variables from `env`, `world` ranks, the spool root its source consumes
    ("" without one), `tensors` (tensor_specs of what it saves)."""
    return {"run_id": env.get("DFLASH_RUN_ID", ""), "role": env.get("ROLE_NAME", ""),
            "process": env.get("DFLASH_PROCESS", ""), "world_size": int(world),
            "model": {k: env[k] for k in MODEL_VARS if k in env}, "spool": spool or "", "tensors": tensors}


def read_identity(path):
    """The identity in checkpoint `path`: a dict, None when it has none (written before identities), or the
    reason it cannot be read (a str)."""
    try:
        fd = os.open(os.path.join(path, IDENTITY_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(1 << 26))  # a model of very many tensors still fits; a planted /dev/zero does not
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"its {IDENTITY_FILE} cannot be read ({type(e).__name__}: {e})"
    keys = ("run_id", "role", "process", "world_size", "model", "spool")
    if not isinstance(data, dict) or any(k not in data for k in keys):
        return f"its {IDENTITY_FILE} lacks some of {', '.join(keys)}"
    tensors = data.get("tensors", {})
    if not (all(isinstance(data[k], str) for k in ("run_id", "role", "process", "spool")) and
            isinstance(data["world_size"], int) and not isinstance(data["world_size"], bool) and
            isinstance(data["model"], dict) and all(isinstance(v, str) for v in data["model"].values()) and
            isinstance(tensors, dict) and all(isinstance(v, list) and len(v) == 2 for v in tensors.values())):
        return f"its {IDENTITY_FILE} has a value of the wrong kind"
    return data


def tensor_specs(state):
    """{key: [dtype, shape]} of every tensor in a (nested) state dict: DTensors by their global shape."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        elif hasattr(value, "dtype") and hasattr(value, "shape"):
            out[prefix] = [str(value.dtype).replace("torch.", ""), list(value.shape)]
    walk("", state)
    return out


def _quoted(s):
    return s if s else '""'


def _model_diff(mine, theirs):
    said = []
    for k in list(mine) + [k for k in theirs if k not in mine]:
        here, there = mine.get(k, "unset"), theirs.get(k, "unset")
        if here != there:
            said.append(f"{k} {_quoted(there)} in it, {_quoted(here)} here")
    return ", ".join(said)


def tensor_diff(mine, theirs):
    """What differs between two tensor_specs, said; "" when nothing does."""
    said = []
    for k in sorted(set(mine) | set(theirs)):
        a, b = mine.get(k), theirs.get(k)
        if a == b:
            continue
        if b is None:
            said.append(f"{k}: not in it")
        elif a is None:
            said.append(f"{k}: in it, not here")
        else:
            said.append(f"{k}: {b[0]} {b[1]} in it, {a[0]} {a[1]} here")
    more = f"; and {len(said) - SHOWN} more" if len(said) > SHOWN else ""
    return "; ".join(said[:SHOWN]) + more


def judge(mine, theirs, adopt, path):
    """(verdict, same_spool, why) for restoring checkpoint `path` whose identity is `theirs` (read_identity's
    answer) into a process whose identity is `mine`: verdict "same" (this run's), "adopt" (another run's, taken on
    purpose: `adopt`), or "refuse" (why says what to do). same_spool: its place in the spool applies here."""
    if isinstance(theirs, str):
        return "refuse", False, (f"checkpoint {path}: {theirs}; put back an intact copy, {_ELSEWHERE}")
    if theirs is None:
        if adopt:
            return "adopt", False, (f"adopting {path} (no run identity: written before checkpoints recorded one; "
                                    f"{ADOPT_VAR}=1)")
        return "refuse", False, (
            f"checkpoint {path} has no run identity (written before dflash-launch recorded one): it may be another "
            f"run's, and a fresh run never resumes another run's checkpoint. To continue the run that wrote it: "
            f"dflash-launch run --resume --run-id <its run id> with {ADOPT_VAR}=1; {_ON_PURPOSE}; {_ELSEWHERE}")
    diff = _model_diff(mine["model"], theirs["model"])
    if diff:
        return "refuse", False, (f"checkpoint {path} was written for another [model] ({diff}): its tensors are not "
                                 f"this model's; fix: the [model] of the run that wrote it (run "
                                 f"{_quoted(theirs['run_id'])}), or another [run] checkpoint_dir")
    if "tensors" in theirs:
        diff = tensor_diff(mine["tensors"], theirs["tensors"])
        if diff:
            return "refuse", False, (
                f"checkpoint {path} holds tensors of another dtype or shape than this model and optimizer ({diff}): "
                f"a restore would convert them silently, never exactly; fix: build the model as the run that wrote "
                f"it did (run {_quoted(theirs['run_id'])}: the same dtype, e.g. no .to(torch.bfloat16) that it did "
                f"not have), or another [run] checkpoint_dir")
    if int(theirs["world_size"]) != int(mine["world_size"]):
        return "refuse", False, (f"checkpoint {path} was written by a world of {theirs['world_size']} ranks, this is "
                                 f"one of {mine['world_size']}; restore it with that many ranks, {_ELSEWHERE}")
    same_run = theirs["run_id"] == mine["run_id"] and theirs["role"] == mine["role"]
    same_spool = theirs["spool"] == mine["spool"]
    if same_run and same_spool:
        return "same", True, ""
    if adopt:
        return "adopt", same_spool, (
            f"adopting {path} of run {_quoted(theirs['run_id'])} (role {_quoted(theirs['role'])}, {ADOPT_VAR}=1): "
            f"its weights, optimizer and step" +
            (", and its place in this spool" if same_spool else "; this spool's frames from its start"))
    if theirs["run_id"] != mine["run_id"]:
        why = (f"checkpoint {path} belongs to run {_quoted(theirs['run_id'])} (role {_quoted(theirs['role'])}), not to "
               f"this run {_quoted(mine['run_id'])}: a fresh run never resumes another run's checkpoint. To continue "
               f"that run: dflash-launch run --resume --run-id {_quoted(theirs['run_id'])}; {_ON_PURPOSE}; "
               f"{_ELSEWHERE}")
    elif theirs["role"] != mine["role"]:
        why = (f"checkpoint {path} is role {_quoted(theirs['role'])}'s, this process is role "
               f"{_quoted(mine['role'])}'s; {_ON_PURPOSE}; {_ELSEWHERE}")
    else:
        why = (f"checkpoint {path} consumed spool {theirs['spool'] or '(none)'}, this run reads "
               f"{mine['spool'] or '(none)'} (was [run] spool_dir changed?): its place in a spool means nothing in "
               f"another; fix: the spool_dir it was written with, or {_ON_PURPOSE} (this spool's frames from its "
               f"start)")
    return "refuse", False, why


def frames_said(frames):
    """"a, b, c and N more" of a sorted list of frame names."""
    frames = sorted(frames)
    more = f" and {len(frames) - SHOWN} more" if len(frames) > SHOWN else ""
    return ", ".join(frames[:SHOWN]) + more

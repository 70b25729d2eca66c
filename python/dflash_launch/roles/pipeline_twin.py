"""configs/dflash-8gpu.toml, scaled to the machine at hand: the shipped file's roles, commands and settings, with a
tiny [model], a tiny Qwen3 checkpoint saved to disk (the targets load it with a real from_pretrained of a local
directory, as they would load /models/Qwen3-32B), few frames, and the GPUs there are (or cpu). `make test` runs it
on CPU (tests/test_dflash_8gpu.py); `python -m dflash_launch.tools.gpu_check --pipeline configs/dflash-8gpu.toml`
(scripts/gpu-check passes it) on a GPU machine (docs/gpu.md, check (e)).

What is changed, and nothing else (each substitution must match exactly once, so an edit of the shipped file that
this does not follow fails loudly): [model] (the shapes: taps and the 5-target/3-drafter topology stay), each
role's `devices` (cpu = N on CPU; on fewer than 8 GPUs the targets share GPU 0 and the drafters take the first
min(3, GPUs)), the targets' --samples, and [run]'s cache, log and spool dirs (into the work dir)."""

import json
import os
import re
import shlex
import subprocess
import time

#: The twin's [model]: the real depth and taps (64 layers, 1,16,31,46,61), tiny widths. CUDA keeps bf16 and
#: enough width for real Triton kernels; CPU runs fp32 (no fast bf16 there).
TWIN_MODEL = {
    "cpu": dict(target_layers=64, hidden=32, tapped_layers=[1, 16, 31, 46, 61], draft_layers=1, block_size=4,
                seq_len=32, batch=1, dtype="fp32", heads=2, kv_heads=1, vocab=256, seed=0),
    "cuda": dict(target_layers=64, hidden=256, tapped_layers=[1, 16, 31, 46, 61], draft_layers=2, block_size=16,
                 seq_len=512, batch=1, dtype="bf16", heads=4, kv_heads=2, vocab=4096, seed=0),
}
#: Frames per target: 5 x 22 = 110 frames for 3 ranks, so the last round is a tail (2 frames): it is padded.
SAMPLES = 22
N_TARGETS, N_DRAFTERS = 5, 3


def _value(v):
    return "[" + ", ".join(str(x) for x in v) + "]" if isinstance(v, list) else json.dumps(v) if isinstance(
        v, str) else str(v)


def _sub(pattern, repl, text):
    out, n = re.subn(pattern, repl, text, flags=re.M | re.S)
    if n != 1:
        raise ValueError(f"the shipped config changed shape: {pattern!r} matched {n} times (update "
                         f"dflash_launch/roles/pipeline_twin.py)")
    return out


def placement(mode, n_gpus):
    """(target devices, drafter devices, share_gpus): None for cpu."""
    if mode != "cuda":
        return None, None, False
    if n_gpus >= N_TARGETS + N_DRAFTERS:
        return list(range(N_TARGETS)), list(range(N_TARGETS, N_TARGETS + N_DRAFTERS)), False
    return [0] * N_TARGETS, list(range(min(N_DRAFTERS, n_gpus))), True


def twin_config(text, work, mode="cpu", n_gpus=0, samples=SAMPLES):
    """The shipped config's text, scaled (see the module's doc). `work`: where its cache, runs and spool go."""
    model = TWIN_MODEL[mode]
    block = "[model]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in model.items()) + "\n"
    text = _sub(r"^\[model\]\n.*?(?=^\[\[role\]\])", lambda _: block, text)
    targets, drafters, share = placement(mode, n_gpus)
    text = _sub(r"^devices = \[0, 1, 2, 3, 4\]$", f"cpu = {N_TARGETS}" if targets is None else
                f"devices = {_value(targets)}", text)
    text = _sub(r"^devices = \[5, 6, 7\]$", f"cpu = {N_DRAFTERS}" if drafters is None else
                f"devices = {_value(drafters)}", text)
    text = _sub(r'"--samples", "\d+"', f'"--samples", "{samples}"', text)
    run = (f'cache_dir = "{work}/cache"\nspool_dir = "{work}/spool"\n' + ("share_gpus = true\n" if share else ""))
    text = _sub(r'^log_dir = "[^"\n]*"', f'log_dir = "{work}/runs"\n' + run.rstrip("\n"), text)
    return text


def save_checkpoint(path, mode="cpu"):
    """A random Qwen3 of the twin's [model], saved with save_pretrained (config.json + model.safetensors). Its
    embedding and LM head get rows of norm ~1 (std hidden^-0.5), the scale of a trained model's (Qwen3-32B's:
    ~1.1): at HF's init (std 0.02, rows of 0.11 at hidden 32) the logits through the frozen, shared head stay
    near zero, and a drafter takes hundreds of steps to learn anything."""
    from dflash_launch._extras import require
    from dflash_launch.roles.hf_target import random_qwen3
    torch = require("torch", "the pipeline twin")
    c = TWIN_MODEL[mode]
    model = random_qwen3(dict(c), torch)
    g = torch.Generator().manual_seed(c["seed"])
    with torch.no_grad():
        for w in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            w.copy_(torch.randn(w.shape, generator=g) * c["hidden"] ** -0.5)
    model.save_pretrained(path)
    return path


def run_twin(shipped, work, launcher, mode="cpu", n_gpus=0, timeout_s=900, env=None, samples=SAMPLES):
    """Writes the checkpoint and the twin of `shipped` into `work`, runs it, and judges it: every process exits 0,
    every frame is consumed exactly once, every drafter takes the same number of steps (the tail padded), and the
    training table and loss.svg are there. Returns the result (a dict; `ok`)."""
    os.makedirs(os.path.join(work, "cache"), mode=0o700, exist_ok=True)
    ckpt = save_checkpoint(os.path.join(work, "checkpoint"), mode)
    config = os.path.join(work, "dflash-8gpu-twin.toml")
    with open(shipped) as f, open(config, "w") as out:
        out.write(twin_config(f.read(), work, mode, n_gpus, samples))
    env = dict(os.environ if env is None else env, DFLASH_TARGET_MODEL=ckpt)
    t0 = time.monotonic()
    try:
        p = subprocess.run([launcher, "run", config, "--run-id", "twin", "--color", "never"], env=env,
                           capture_output=True, text=True, timeout=timeout_s)
        rc, console = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, console = None, f"timed out after {timeout_s}s: {e}"
    with open(os.path.join(work, "twin.console.txt"), "w") as f:
        f.write(console)
    return judge(os.path.join(work, "runs", "twin"), rc, console, config, round(time.monotonic() - t0, 1))


def judge(run_dir, rc, console, config, wall_s):
    out = {"config": config, "run_dir": run_dir, "exit_code": rc, "wall_s": wall_s}
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "spool.json")) as f:
            spool = json.load(f)
    except (OSError, ValueError) as e:
        return dict(out, ok=False, error=f"{e}; see {config} and {run_dir}")
    procs = summary["processes"]
    drafters = [p for p in procs if p["role"] == "drafter"]
    steps = [(p["metrics"] or {}).get("steps") for p in drafters]
    losses = {p["name"]: [(p["metrics"] or {}).get("first_loss"), (p["metrics"] or {}).get("last_loss")]
              for p in drafters}
    out.update(processes={p["name"]: p["exit_code"] for p in procs}, drafter_steps=steps, losses=losses,
               frames=spool.get("frames_published"), exactly_once=spool.get("exactly_once"),
               padded=sum((p["metrics"] or {}).get("frames_padded", 0) for p in drafters),
               gate={p["name"]: (p["gate"] or {}).get("role") for p in drafters + summary.get("warmups", [])},
               training_table="loss first -> last" in console and os.path.exists(os.path.join(run_dir, "loss.svg")))
    out["ok"] = bool(rc == 0 and all(c == 0 for c in out["processes"].values()) and out["exactly_once"]
                     and len(set(steps)) == 1 and steps[0] and out["training_table"])
    if not out["ok"]:
        out["error"] = f"see {os.path.join(os.path.dirname(run_dir), '..', 'twin.console.txt')} and {run_dir}"
    return out


def gpu_check(shipped, mode, n_gpus, launcher, work, timeout_s):
    """Check (e) of dflash_launch.tools.gpu_check: the twin on this machine's GPUs (or cpu); `ok` None when transformers
    is missing (the targets need it: `pip install transformers`)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"ok": None, "note": "not run: the targets need transformers (pip install transformers)"}
    import sys
    import dflash_launch
    # The config's `python` is this Python (the one with torch), as the wheel's entry point and `. scripts/env`
    # arrange: a `python` first on PATH that execs it (the machine may have only python3, or another python). A
    # script, not a symlink: a venv's python finds its pyvenv.cfg beside the path it was started as.
    work = os.path.join(work, "pipeline")
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    with open(os.path.join(bin_dir, "python"), "w") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    os.chmod(os.path.join(bin_dir, "python"), 0o755)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(dflash_launch.__file__))),
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    out = run_twin(shipped, work, launcher, mode, n_gpus, timeout_s, env)
    targets, drafters, _ = placement(mode, n_gpus)
    out["note"] = (f"{os.path.basename(shipped)} scaled: 5 targets on {targets or 'cpu'}, the DDP drafters on "
                   f"{drafters or 'cpu'}: steps {out.get('drafter_steps')}, {out.get('frames')} frames exactly once "
                   f"{out.get('exactly_once')}, loss {out.get('losses')}")
    return out


def summary_line(result):
    state = "ok  " if result["ok"] else ("-   " if result["ok"] is None else "FAIL")
    return f"  (e) pipeline {state} {result['note']}"

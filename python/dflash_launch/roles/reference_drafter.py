"""A tiny DFlash drafter, faithful to the real one at toy size, trained with a
torch.compile'd step. The reference payload of dflash-launch (configs/demo.toml).

The model (z-lab/dflash, SpecForge): the target's tapped hidden states arrive
concatenated, [B, S, n_taps*H]; `fc: n_taps*H -> H` (no bias) and an RMSNorm
make the context. The sequence is cut into blocks of `block_size`: position 0 of
each block is the real anchor token, positions 1.. are mask tokens to predict,
all in parallel. Each draft layer attends from the block tokens to the context
up to the anchor and to their own block. Attention: on CUDA flex_attention with
that mask as a block mask (what DFlash trains with); on CPU SDPA with a dense
boolean mask (flex_attention has no backward on CPU). --attention/DFLASH_ATTENTION
picks one explicitly. Loss: cross-entropy on k >= 1, weighted exp(-(k-1)/gamma).

Run by dflash-launch, it reads the shape contract from DFLASH_* variables,
says ready (notify) after its first compiled step, and writes its Inductor cache
counters and compile times to $DFLASH_METRICS_FILE. Under dflash-launch it
checkpoints (dflash_launch.Checkpoint in $DFLASH_CHECKPOINT_DIR, every
--checkpoint-every steps) and a restarted process resumes from its last
checkpoint, the spool's frames committed with it (docs/checkpoints.md).
"""

import argparse
import os
import resource
import sys
import time

from dflash_launch._extras import require
from dflash_launch.inductor import isa_verdict

require("torch", "the reference drafter")  # before the imports below: an error that names the extra
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dflash_launch import (HiddenStateContractError, check_hidden_states, contract_from_env, gate_role, notify_ready,
                           notify_status, share_isa_probe)
from dflash_launch.train_metrics import TrainingMetrics, write_json_private  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(positions, head_dim, base=10000.0):
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def block_mask(seq_len, block_size):
    """[S, 2S] bool: query i (block j, anchor a = j*bs) sees context 0..a and its own block."""
    q = torch.arange(seq_len)
    anchor = (q // block_size) * block_size
    ctx = torch.arange(seq_len)[None, :] <= anchor[:, None]
    blk = (torch.arange(seq_len)[None, :] // block_size) == (q[:, None] // block_size)
    return torch.cat([ctx, blk], dim=1)


def flex_block_mask(seq_len, block_size, device):
    """The same mask as block_mask(), as a flex_attention BlockMask: kv < S is context (kv <= anchor),
    kv >= S is the block tokens (same block as the query)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        anchor = (q_idx // block_size) * block_size
        ctx = (kv_idx < seq_len) & (kv_idx <= anchor)
        blk = (kv_idx >= seq_len) & ((kv_idx - seq_len) // block_size == q_idx // block_size)
        return ctx | blk

    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=seq_len, KV_LEN=2 * seq_len, device=device)


def pick_attention(requested, device):
    """"flex" on CUDA, "sdpa" elsewhere, unless asked for one."""
    if requested in ("flex", "sdpa"):
        return requested
    return "flex" if torch.device(device).type == "cuda" else "sdpa"


def block_weights(seq_len, block_size, gamma):
    k = torch.arange(seq_len) % block_size
    return torch.where(k >= 1, torch.exp(-(k - 1).float() / gamma), torch.zeros(()))


class DraftLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.attn_norm = RMSNorm(hidden)
        self.mlp_norm = RMSNorm(hidden)
        inter = 3 * hidden
        self.gate = nn.Linear(hidden, inter, bias=False)
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x, ctx, mask, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        kv_in = torch.cat([ctx, h], dim=1)  # the context, then the block tokens
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(kv_in).view(b, 2 * s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(kv_in).view(b, 2 * s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos[:s], sin[:s])
        k = apply_rotary(k, torch.cat([cos[:s], cos[:s]]), torch.cat([sin[:s], sin[:s]]))
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if isinstance(mask, torch.Tensor):
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:  # a flex_attention BlockMask
            from torch.nn.attention.flex_attention import flex_attention
            a = flex_attention(q, k, v, block_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Drafter(nn.Module):
    def __init__(self, n_taps, hidden, vocab, layers, heads, kv_heads, block_size, seq_len, gamma=7.0):
        super().__init__()
        self.block_size, self.mask_id = block_size, vocab - 1
        self.fc = nn.Linear(n_taps * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden)
        self.embed = nn.Embedding(vocab, hidden)              # shared with the target, frozen
        self.layers = nn.ModuleList([DraftLayer(hidden, heads, kv_heads) for _ in range(layers)])
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)   # shared with the target, frozen
        self.embed.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)
        cos, sin = rotary(torch.arange(seq_len), hidden // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", block_mask(seq_len, block_size), persistent=False)
        self.register_buffer("weights", block_weights(seq_len, block_size, gamma), persistent=False)
        self.seq_len, self.flex_mask = seq_len, None

    def use_flex_attention(self, device):
        """Attend with flex_attention (a BlockMask on `device`) instead of SDPA with the dense mask."""
        self.flex_mask = flex_block_mask(self.seq_len, self.block_size, device)

    def forward(self, target_hidden, tokens):
        ctx = self.hidden_norm(self.fc(target_hidden))
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        block_in = torch.where(pos % self.block_size == 0, tokens, torch.full_like(tokens, self.mask_id))
        x = self.embed(block_in)
        mask = self.flex_mask if self.flex_mask is not None else self.mask
        for layer in self.layers:
            x = layer(x, ctx, mask, self.cos, self.sin)
        return self.lm_head(self.norm(x))

    def loss(self, target_hidden, tokens):
        return self.loss_of(self.forward(target_hidden, tokens), tokens)

    def loss_of(self, logits, tokens):
        """The block-weighted cross-entropy of `logits` (this model's, or its DDP wrapper's forward)."""
        ce = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="none").view(tokens.shape)
        return (ce * self.weights).sum() / (self.weights.sum() * tokens.shape[0])


def ddp_loss(ddp, model):
    """The loss through DistributedDataParallel's forward (DDP readies its gradient all-reduce there)."""
    def step_loss(target_hidden, tokens):
        return model.loss_of(ddp(target_hidden, tokens), tokens)
    return step_loss


def build(contract, dtype=torch.float32):
    c = contract
    n_taps, hidden = len(c["tapped_layers"]), c["hidden"]
    heads = c["heads"] or max(1, hidden // 64)
    kv = c["kv_heads"] or heads
    torch.manual_seed(c["seed"])
    model = Drafter(n_taps, hidden, c["vocab"], c["draft_layers"], heads, kv, c["block_size"], c["seq_len"])
    return model.to(dtype)


class SyntheticSource:
    """Hidden states of the contract's shape and tokens with a learnable pattern,
    until a real target feeds the drafter (the builtin target, via the spool)."""

    def __init__(self, contract, rank, dtype):
        self.c, self.dtype = contract, dtype
        self.g = torch.Generator().manual_seed(1000 + rank)

    def skip(self, n):
        """Past the first `n` samples (a resumed run goes on with the ones it had not trained on)."""
        it = iter(self)
        for _ in range(n):
            next(it)

    def __iter__(self):
        c = self.c
        b, s, width = c["hidden_shape"]
        vocab = c["vocab"] - 1  # the last id is the drafter's mask token
        while True:
            start = torch.randint(0, vocab, (b, 1), generator=self.g)
            tokens = (start + 7 * torch.arange(s)) % vocab      # a pattern the drafter can learn
            hidden = torch.randn(b, s, width, generator=self.g).to(self.dtype)
            yield {"tokens": tokens, "hidden": hidden, "seq": None, "producer": "synthetic"}


def cache_counters():
    from torch._dynamo.utils import counters
    ind, aot, dyn = counters["inductor"], counters["aot_autograd"], counters["dynamo_cache"]
    return {
        # Dynamo's precompile cache is never on here (docs/cachelock.md, "What is exact"): 0 hits, said for tools
        # that read these counters.
        "dynamo_cache_hit": int(dyn["dynamo_cache_hit"]),
        "dynamo_cache_miss": int(dyn["dynamo_cache_miss"]),
        "fxgraph_cache_hit": int(ind["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(ind["fxgraph_cache_miss"]),
        "fxgraph_cache_bypass": int(ind["fxgraph_cache_bypass"]),
        "autograd_cache_hit": int(aot["autograd_cache_hit"]),
        "autograd_cache_miss": int(aot["autograd_cache_miss"]),
        # Inductor's vector-ISA probes: run here, or answered by a verdict the host already had (isa_verdict).
        **isa_verdict.stats(),
    }


def compile_breakdown():
    """Seconds per compile phase (what a cache hit still pays for)."""
    from torch._dynamo.utils import compile_times
    names, values = compile_times(repr="csv")
    keep = {"_compile.compile_inner": "dynamo_total", "bytecode_tracing": "dynamo_tracing",
            "create_aot_dispatcher_function": "aot_autograd", "compile_fx_inner": "inductor",
            "fx_codegen_and_compile": "inductor_codegen_and_compile", "compile_file": "cpp_compile",
            "PyCodeCache.load_by_key_path": "load_modules", "build_guards": "guards"}
    out = {}
    for name, value in zip(names, values):
        if name in keep:
            out[keep[name]] = round(sum(float(v) for v in str(value).split(",") if v.strip()), 4)
    return out


def cpu_seconds():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def write_metrics(path, metrics):
    """`metrics` as JSON at `path` (0600 like every file of the run, docs/logs.md; never through a link)."""
    if path:
        write_json_private(path, metrics)


def _contract_exit(name, error):
    """Says what violates the contract and returns the exit code (65, EX_DATAERR: common/exit_codes.h)."""
    from dflash_launch.spool import EXIT_FRAME_CONTRACT
    print(f"{name}: {error}", file=sys.stderr, flush=True)
    return getattr(error, "exit_code", EXIT_FRAME_CONTRACT)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("DFLASH_STEPS", "20")))
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--source", choices=["synthetic", "spool"], default=os.environ.get("DFLASH_SOURCE", "synthetic"))
    p.add_argument("--metrics", default=os.environ.get("DFLASH_METRICS_FILE", ""))
    p.add_argument("--no-compile", action="store_true", help="eager (for comparisons)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("DFLASH_TORCH_THREADS", "1")))
    p.add_argument("--device", default=os.environ.get("DFLASH_DEVICE", "auto"),
                   help="auto: cuda when a GPU is visible (CUDA_VISIBLE_DEVICES), else cpu")
    p.add_argument("--attention", choices=["auto", "flex", "sdpa"], default=os.environ.get("DFLASH_ATTENTION", "auto"),
                   help="auto: flex_attention on CUDA, SDPA with a dense mask on CPU")
    p.add_argument("--ddp", action="store_true", default=os.environ.get("DFLASH_DDP") == "1",
                   help="train as one DistributedDataParallel world with the role's other processes (world = "
                        "\"role\" in run.toml): nccl on CUDA, gloo on CPU; the spool through WorldSource, so every "
                        "rank takes the same steps")
    p.add_argument("--pace-ms", type=int, default=int(os.environ.get("DFLASH_PACE_MS", "0")),
                   help="sleep per step while holding the frame (tests: a slow step, as dflash-builtin drafter's)")
    p.add_argument("--tail", choices=["pad", "drop"], default=os.environ.get("DFLASH_TAIL", "pad"),
                   help="--ddp: the last round of frames, fewer than the ranks (dflash_launch.spool.world)")
    p.add_argument("--checkpoint-every", type=int, default=int(os.environ.get("DFLASH_CHECKPOINT_EVERY", "50")),
                   help="a checkpoint every N steps in $DFLASH_CHECKPOINT_DIR (dflash-launch sets it), and one at "
                        "the end and on SIGTERM; a restart resumes from the last (0: none; docs/checkpoints.md)")
    return p.parse_args(argv)


def join_world(args, device):
    """--ddp: the role's torch world (a world of one in a warm-up); returns (rank, world size)."""
    from dflash_launch import init_process_group
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    return init_process_group(backend, world="role")


def open_source(args, contract, name, rank, dtype, model, metrics):
    """The frames: the spool (through WorldSource: equal steps in a DDP world, acknowledged with the loss)
    with the target's shared weights copied into `model`, or synthetic ones. Raises FrameContractError when the
    shared weights violate the contract (main() says it and exits with its code)."""
    if args.source != "spool":
        return SyntheticSource(contract, rank, dtype)
    from dflash_launch.spool import WorldSource
    source = WorldSource.from_env(contract, name, tail=args.tail, metrics=metrics)
    shared = source.shared_weights()  # the target's embedding and LM head, frozen (DFlash shares them)
    with torch.no_grad():
        for key, value in shared.items():
            model.get_parameter(key).copy_(value)
    return source


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    contract = contract_from_env()
    if not contract:
        sys.exit("reference_drafter: run me under dflash-launch (or set DFLASH_HIDDEN_SHAPE & co.)")
    warmup = os.environ.get("DFLASH_WARMUP") == "1"
    steps = 1 if warmup else args.steps
    if warmup:
        args.source = "synthetic"  # no targets run during a warm-up; same shapes, same compiled graphs
    torch.set_num_threads(args.threads)
    share_isa_probe()  # before the first compile: a gated follower skips Inductor's probe children
    name = os.environ.get("DFLASH_PROCESS", "drafter")
    rank = int(os.environ.get("ROLE_RANK", "0"))
    dtype = DTYPES[contract["dtype"]]
    t_start, cpu_start = time.perf_counter(), cpu_seconds()

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    attention = pick_attention(args.attention, device)
    world = join_world(args, device)[1] if args.ddp else 1
    model = build(contract, dtype).to(device)
    if attention == "flex":
        model.use_flex_attention(device)
    metrics = TrainingMetrics(args.metrics)
    try:
        source = open_source(args, contract, name, rank, dtype, model, metrics)
    except HiddenStateContractError as e:  # the shared weights violate [model]
        sys.exit(_contract_exit(name, e))
    step_loss = model.loss
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[0] if torch.device(device).type == "cuda" else None)
        step_loss = ddp_loss(ddp, model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    if not args.no_compile:
        step_loss = torch.compile(step_loss)
    ckpt, start = None, 0
    if args.checkpoint_every > 0 and os.environ.get("DFLASH_CHECKPOINT_DIR") and not warmup:
        from dflash_launch.checkpoint import Checkpoint
        ckpt = Checkpoint(ddp if args.ddp else model, opt, every_steps=args.checkpoint_every,
                          source=source if args.source == "spool" else None, metrics=metrics)
        start = ckpt.restore()
        if args.source != "spool" and start:
            source.skip(start)

    n_taps, hidden = len(contract["tapped_layers"]), contract["hidden"]
    losses = []
    metrics.update(process=name, gate_role=gate_role(), torch_version=torch.__version__, device=str(device),
                   attention=attention, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), ddp_world=world)
    if torch.device(device).type == "cuda":
        metrics.update(device_name=torch.cuda.get_device_name(0),
                       device_uuid=str(getattr(torch.cuda.get_device_properties(0), "uuid", "")))
    it = iter(source)
    for step in range(start, steps):
        try:
            sample = next(it, None)
        except HiddenStateContractError as e:  # a spool frame that violates [model]: rejected, never consumed
            metrics.update(rejected=getattr(e, "frame", None), **(source.stats() if hasattr(source, "stats") else {}))
            metrics.write()
            sys.exit(_contract_exit(name, e))
        if sample is None:
            break
        check_hidden_states(sample["hidden"], n_taps, hidden, contract["batch"], contract["seq_len"])
        t0, cpu_t0 = time.perf_counter(), cpu_seconds()
        loss = step_loss(sample["hidden"].to(device), sample["tokens"].to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 5))
        if args.pace_ms > 0:
            time.sleep(args.pace_ms / 1000)
        (sample["ack"] if "ack" in sample else metrics.step)(losses[-1])  # the step, its loss, the frame's ack
        if ckpt is not None:
            ckpt.step(step)
        if step == start:
            first_step(metrics, t_start, cpu_start, t0, cpu_t0)
            print(f"{name}: first step {losses[0]:.4f}, compiled in {metrics.data['compile_wall_s']:.1f}s "
                  f"({metrics.data['gate_role'] or 'ungated'}; fxgraph hits {metrics.data['fxgraph_cache_hit']} "
                  f"misses {metrics.data['fxgraph_cache_miss']})", flush=True)
        elif step % 10 == 0:
            notify_status(f"step {step} loss {losses[-1]:.4f}")
            print(f"{name}: step {step} loss {losses[-1]:.4f}", flush=True)
    if ckpt is not None:
        ckpt.finish()  # the steps since the last checkpoint, and their frames (a no-op if the source's end did it)
    metrics.update(**cache_counters())
    metrics.update(samples=len(losses) * contract["batch"], source=args.source, run_s=round(time.perf_counter() - t_start, 3))
    if hasattr(source, "stats"):
        metrics.update(**source.stats())
    metrics.write()
    if losses:
        print(f"{name}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if args.ddp:
        torch.distributed.destroy_process_group()


def first_step(metrics, t_start, cpu_start, t0, cpu_t0):
    """After the first compiled step: the compile's cost into the metrics (written at once), then READY."""
    metrics.update(**cache_counters())
    metrics.update(compile_wall_s=round(time.perf_counter() - t_start, 3),
                   compile_cpu_s=round(cpu_seconds() - cpu_start, 3),
                   first_step_s=round(time.perf_counter() - t0, 3),
                   # The step alone: a follower that loaded Dynamo's artifact did the load in
                   # torch.compile() above (in compile_cpu_s, not here).
                   first_step_cpu_s=round(cpu_seconds() - cpu_t0, 3),
                   compile_breakdown=compile_breakdown())
    metrics.write()
    # The first compiled step ran: the Inductor cache holds our kernels.
    notify_ready(f"compiled in {metrics.data['compile_wall_s']:.1f}s "
                 f"(fx hits {metrics.data['fxgraph_cache_hit']}, misses {metrics.data['fxgraph_cache_miss']})")


if __name__ == "__main__":
    main()

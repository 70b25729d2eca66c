"""A ready-made DFlash target over Hugging Face transformers: runs a causal LM with
`output_hidden_states=True`, takes the `[model]` tapped layers (layer id i is HF
`hidden_states[i+1]`; index 0 is the embeddings), concatenates them on the
feature axis as [batch, seq, n_taps * hidden] and publishes them to the run's
spool (`SpoolProducer.from_env`), with the model's embedding and LM head as the
drafters' shared weights. Give its role `spool = "produce"`:

    [[role]]
    name = "target"
    devices = [0, 1]
    spool = "produce"
    command = ["python", "-m", "dflash_launch.roles.hf_target", "--model", "/models/Qwen3-8B",
               "--tokens", "data/train.jsonl", "--samples", "5000"]

--model: a local directory or a hub name (from_pretrained; nothing is downloaded
  unless the hub cache lacks it and the network is there).
--random-qwen3: a random Qwen3 built from [model] (hidden, target_layers, vocab,
  heads, kv_heads; seed): no download, identical in every process (tests, dry runs).
--tokens FILE.jsonl: one sample per line, a JSON list of ids or {"input_ids": [..]},
  cropped or padded to [model] seq_len; process r of a role of W takes lines r, r+W, ...
  Without it, the builtin target's token chain (dflash_launch.token_chain: a fixed Markov
  chain over 64 ids of the vocabulary, learnable, so the drafters' loss falls; a function
  of seed, rank and sample number, so a restarted process republishes what it published
  before, and resumes after it). Uniform random ids could not be learnt.

Each process publishes --samples frames ([model] batch samples each), says READY
after the first, and marks its end: the drafters' sources end when every producer
of the run has. In a warm-up (DFLASH_WARMUP=1) the producer publishes nothing.
Needs `transformers`: `pip install 'dflash-launch[hf]'` (or transformers into this venv).
"""

import argparse
import json
import os
import sys
import time

from dflash_launch import contract_from_env, notify_ready, notify_status
from dflash_launch._extras import require
from dflash_launch.train_metrics import write_json_private

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
EXIT_CONTRACT = 65


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a local directory or hub name for AutoModelForCausalLM.from_pretrained")
    src.add_argument("--random-qwen3", action="store_true", help="a random Qwen3 built from [model] (no download)")
    p.add_argument("--tokens", help="JSONL of token id lists (default: the builtin target's learnable token chain)")
    p.add_argument("--samples", type=int, default=int(os.environ.get("DFLASH_SAMPLES", "100")),
                   help="frames this process publishes")
    p.add_argument("--max-ready", type=int, default=int(os.environ.get("DFLASH_SPOOL_MAX", "16")),
                   help="backpressure: wait while the spool holds this many unclaimed frames")
    p.add_argument("--device", default="auto", help="auto: cuda when a GPU is visible, else cpu")
    p.add_argument("--progress", action="store_true",
                   help="show transformers' progress bars (\"Loading weights\"): off by default, since every target "
                        "process would draw its own on the run's one console")
    return p.parse_args(argv)


def load_pretrained(transformers, model, dtype, progress=False):
    """AutoModelForCausalLM.from_pretrained, its progress bars off unless `progress`."""
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    return transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)


def random_qwen3(contract, torch):
    """A random Qwen3ForCausalLM of [model]'s shape, the same weights in every process (seed)."""
    transformers = require("transformers", "dflash_launch.roles.hf_target")
    c = contract
    heads = c["heads"] or max(1, c["hidden"] // 16)
    config = transformers.Qwen3Config(
        vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=2 * c["hidden"],
        num_hidden_layers=c["target_layers"], num_attention_heads=heads, num_key_value_heads=c["kv_heads"] or heads,
        head_dim=c["hidden"] // heads, max_position_embeddings=max(128, c["seq_len"]), tie_word_embeddings=False)
    torch.manual_seed(c["seed"])
    return transformers.Qwen3ForCausalLM(config)


def check_model(model, contract):
    """The model against [model]: a target of another shape would publish frames no drafter can read."""
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    found = {"target_layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size}
    bad = [f"[model] {k} = {contract[k]} but the model has {v}" for k, v in found.items() if contract[k] != v]
    taps = contract["tapped_layers"]
    if taps and max(taps) >= cfg.num_hidden_layers:
        bad.append(f"[model] tapped_layers {taps} names a layer the model lacks (it has {cfg.num_hidden_layers})")
    return bad


class TokenSource:
    """Samples of [batch, seq_len] ids for frame `seq` of process `rank` of `world`."""

    def __init__(self, torch, contract, path, rank, world):
        self.torch, self.c, self.rank, self.world = torch, contract, rank, world
        self.lines, self.chain = None, None
        if path:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            self.lines = [r["input_ids"] if isinstance(r, dict) else r for r in rows][rank::world]
            if not self.lines:
                raise ValueError(f"{path} holds no sample for process {rank} of {world}")
        else:
            from dflash_launch.token_chain import TokenChain
            self.chain = TokenChain(contract["seed"], contract["vocab"])

    def frame(self, seq):
        torch, b, s = self.torch, self.c["batch"], self.c["seq_len"]
        if self.chain is not None:  # sample b of frame seq, as the builtin target numbers them
            return torch.tensor([self.chain.sample(self.rank, seq * b + i, s) for i in range(b)], dtype=torch.long)
        out = torch.zeros(b, s, dtype=torch.long)
        for i in range(b):
            ids = self.lines[(seq * b + i) % len(self.lines)][:s]
            out[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch = require("torch", "dflash_launch.roles.hf_target")
    from dflash_launch.spool import SpoolProducer

    contract = contract_from_env()
    if not contract:
        sys.exit("hf_target: run me under dflash-launch (or set DFLASH_HIDDEN_SHAPE & co.)")
    name = os.environ.get("DFLASH_PROCESS", "target")
    rank, world = int(os.environ.get("ROLE_RANK", "0")), int(os.environ.get("ROLE_WORLD_SIZE", "1"))
    dtype = getattr(torch, DTYPES[contract["dtype"]])
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.perf_counter()
    if args.random_qwen3:
        model = random_qwen3(contract, torch)
    else:
        transformers = require("transformers", "dflash_launch.roles.hf_target")
        model = load_pretrained(transformers, args.model, dtype, args.progress)
    bad = check_model(model, contract)
    if bad:
        print(f"{name}: the target does not match [model]:\n  " + "\n  ".join(bad) +
              "\n  fix: set [model] to the target's shape (target_layers, hidden, vocab), or run the target it "
              "describes", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONTRACT)
    model = model.to(device=device, dtype=dtype).eval()
    producer = SpoolProducer.from_env(contract, name, max_ready=args.max_ready)
    try:
        tokens = TokenSource(torch, contract, args.tokens, rank, world)
    except (OSError, ValueError) as e:  # no --tokens file, not JSON lines, or none of its samples for this rank
        sys.exit(f"hf_target: --tokens {args.tokens}: {e}")
    taps = contract["tapped_layers"]
    # DFlash shares the target's embedding and LM head with the drafter (the first publisher wins).
    won = producer.publish_weights(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    resumed_at, published, forward_s = producer.next_seq, 0, 0.0
    print(f"{name}: {'resuming at' if resumed_at else 'publishing from'} frame {resumed_at} of {args.samples}: "
          f"taps {taps} of {contract['target_layers']} layers on {device}"
          f"{'; published the shared weights' if won else ''}", flush=True)
    with torch.no_grad():
        while producer.next_seq < args.samples:
            ids = tokens.frame(producer.next_seq)
            t0 = time.perf_counter()
            out = model(ids.to(device), output_hidden_states=True, use_cache=False)
            hidden = torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1).to("cpu", dtype)
            forward_s += time.perf_counter() - t0
            producer.publish(hidden, ids)
            published += 1
            if published == 1:
                notify_ready(f"first frame published ({forward_s:.2f}s forward)")
            elif published % 50 == 0:
                notify_status(f"{producer.next_seq}/{args.samples} frames")
    producer.finish()
    metrics = {"process": name, "role": "target", "impl": "hf_target", "model": args.model or "random-qwen3",
               "tokens": args.tokens or "token chain", "frames": published,
               "next_seq": producer.next_seq, "resumed_at": resumed_at, "weights_published": won,
               "forward_s": round(forward_s, 3), "wall_s": round(time.perf_counter() - t_start, 3)}
    path = os.environ.get("DFLASH_METRICS_FILE")
    if path:
        write_json_private(path, metrics)
    print(f"{name}: done: {producer.next_seq} frames ({published} now, "
          f"{1000 * forward_s / max(1, published):.1f} ms forward each)", flush=True)


if __name__ == "__main__":
    main()

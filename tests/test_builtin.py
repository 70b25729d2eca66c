"""dflash-builtin against Python recomputations (issue #6): the target's taps with
HF semantics, and the C++ drafter against the Python reference drafter."""
import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import BIN, ROOT, run

sys.path.insert(0, str(ROOT / "python"))
from dflash_launch import contract_from_env  # noqa: E402
from dflash_launch.roles.reference_drafter import apply_rotary, build, rotary  # noqa: E402

BUILTIN = BIN / "dflash-builtin"
pytestmark = pytest.mark.skipif(not BUILTIN.exists(), reason="dflash-builtin not built (no LibTorch)")

DEMO = dict(target_layers=64, hidden=64, tapped_layers=[1, 16, 31, 46, 61], draft_layers=2, block_size=4,
            seq_len=64, batch=1, dtype="fp32", heads=4, kv_heads=2, vocab=256, seed=0)


def model_env(**kw):
    """The DFLASH_* variables dflash-launch would set for this [model]; the suite's own DFLASH_TESTS_* stay (the
    kernel store in front of g++, conftest.py: without them a compile here bypasses it)."""
    c = dict(DEMO, **kw)
    n = len(c["tapped_layers"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_") or k.startswith("DFLASH_TESTS_")}
    env.update({
        "DFLASH_HIDDEN_SHAPE": f"{c['batch']},{c['seq_len']},{n * c['hidden']}",
        "DFLASH_TAPPED_LAYERS": ",".join(map(str, c["tapped_layers"])),
        "DFLASH_TARGET_LAYERS": str(c["target_layers"]), "DFLASH_HIDDEN": str(c["hidden"]),
        "DFLASH_DRAFT_LAYERS": str(c["draft_layers"]), "DFLASH_BLOCK_SIZE": str(c["block_size"]),
        "DFLASH_SEQ_LEN": str(c["seq_len"]), "DFLASH_BATCH": str(c["batch"]), "DFLASH_DTYPE": c["dtype"],
        "DFLASH_VOCAB": str(c["vocab"]), "DFLASH_SEED": str(c["seed"]), "DFLASH_HEADS": str(c["heads"]),
        "DFLASH_KV_HEADS": str(c["kv_heads"]),
    })
    return env


def builtin(args, env, ok=True):
    r = run([BUILTIN, *args], env=env)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def hf_hidden_states(w, tokens, c):
    """A Llama-style decoder written out in PyTorch, returning hidden states the
    way transformers' output_hidden_states does: [0] the embeddings, then each
    layer's output, the last one after the final norm."""
    B, S = tokens.shape
    H, heads, kv = c["hidden"], c["heads"], c["kv_heads"]
    hd = H // heads

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    cos, sin = rotary(torch.arange(S), hd)
    x = F.embedding(tokens, w["embed.weight"])
    hs = [x]
    for i in range(c["target_layers"]):
        p = lambda k: w[f"layers.{i}.{k}.weight"]  # noqa: E731
        h = rms(x, p("attn_norm"))
        q = F.linear(h, p("q")).view(B, S, heads, hd).transpose(1, 2)
        k = F.linear(h, p("k")).view(B, S, kv, hd).transpose(1, 2)
        v = F.linear(h, p("v")).view(B, S, kv, hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(a.transpose(1, 2).reshape(B, S, H), p("o"))
        h = rms(x, p("mlp_norm"))
        x = x + F.linear(F.silu(F.linear(h, p("gate"))) * F.linear(h, p("up")), p("down"))
        hs.append(x)
    hs[-1] = rms(x, w["norm.weight"])
    return hs


@pytest.mark.parametrize("shape", [
    {},  # the demo: 64 layers, taps 1,16,31,46,61
    dict(target_layers=8, tapped_layers=[0, 3, 7], hidden=32, heads=2, kv_heads=1, seq_len=16, vocab=64),
], ids=["demo-64-layers", "last-layer-tap"])
def test_taps_match_a_python_recomputation(tmp_path, shape):
    c = dict(DEMO, **shape)
    env = model_env(**shape)
    builtin(["export-target", "--out", tmp_path / "w.safetensors"], env)
    builtin(["tap", "--rank", "2", "--seq", "5", "--out", tmp_path / "f.safetensors"], env)
    w = load_file(tmp_path / "w.safetensors")
    frame = load_file(tmp_path / "f.safetensors")
    n = len(c["tapped_layers"])
    assert frame["hidden"].shape == (1, c["seq_len"], n * c["hidden"])  # concatenated, never stacked
    assert frame["tokens"].shape == (1, c["seq_len"]) and frame["tokens"].dtype == torch.int64
    hs = hf_hidden_states(w, frame["tokens"], c)
    assert len(hs) == c["target_layers"] + 1
    want = torch.cat([hs[i + 1] for i in c["tapped_layers"]], dim=-1)  # layer id i = hidden_states[i+1]
    diff = (frame["hidden"] - want).abs().max().item()
    print(f"max |C++ - Python| over the taps: {diff:.3g}")
    assert diff < 1e-4
    # Each tap sits where the contract says: tap j is columns j*H..(j+1)*H.
    for j, i in enumerate(c["tapped_layers"]):
        block = frame["hidden"][..., j * c["hidden"]:(j + 1) * c["hidden"]]
        assert torch.allclose(block, hs[i + 1], atol=1e-4)
    if c["target_layers"] - 1 in c["tapped_layers"]:
        # HF: the last entry is after the final norm (RMS 1 per position).
        last = frame["hidden"][..., -c["hidden"]:]
        assert torch.allclose(last.pow(2).mean(-1), torch.ones(1, c["seq_len"]), atol=1e-3)


def test_replicas_are_identical_and_samples_differ(tmp_path):
    env = model_env()
    for name in ("a", "b"):
        builtin(["export-target", "--out", tmp_path / f"{name}.safetensors"], env)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    frames = {}
    for rank, seq in [(0, 0), (0, 0), (1, 0), (0, 1)]:
        out = tmp_path / f"f{rank}-{seq}.safetensors"
        builtin(["tap", "--rank", rank, "--seq", seq, "--out", out], env)
        frames.setdefault((rank, seq), []).append(load_file(out)["tokens"][0])
    assert torch.equal(*frames[(0, 0)])  # (rank, seq) decides the sample
    assert not torch.equal(frames[(0, 0)][0], frames[(1, 0)][0])  # replicas sample differently
    assert not torch.equal(frames[(0, 0)][0], frames[(0, 1)][0])
    # A learnable process: a fixed Markov chain that mostly follows one successor,
    # never emitting the drafter's mask token (vocab-1).
    for s in range(8):
        builtin(["tap", "--rank", "3", "--seq", s, "--out", tmp_path / f"t{s}.safetensors"], env)
    toks = torch.cat([load_file(tmp_path / f"t{s}.safetensors")["tokens"][0] for s in range(8)])
    assert int(toks.max()) < DEMO["vocab"] - 1
    succ = {}
    for a, b in zip(toks[:-1].tolist(), toks[1:].tolist()):
        succ.setdefault(a, []).append(b)
    top = sum(max(nx.count(x) for x in set(nx)) for nx in succ.values())
    assert top / (len(toks) - 1) > 0.8
    assert len(set(toks.tolist())) <= 64


def test_hf_targets_default_tokens_are_the_builtins_chain(tmp_path):
    """dflash_launch.roles.hf_target without --tokens samples the builtin target's chain, id for id (issue #39: its
    uniform random ids could not be learnt), for every batch element of a frame, another seed and vocab too."""
    from dflash_launch.roles.hf_target import TokenSource
    for c, rank, seq in [(DEMO, 0, 0), (DEMO, 3, 7), (dict(DEMO, seed=5, vocab=1000, batch=2), 1, 4)]:
        out = tmp_path / f"tap-{rank}-{seq}.safetensors"
        builtin(["tap", "--rank", rank, "--seq", seq, "--out", out], model_env(**c))
        want = load_file(out)["tokens"]
        got = TokenSource(torch, c, None, rank, 5).frame(seq)
        assert got.dtype == torch.long and torch.equal(got, want), (c, rank, seq)


def test_frames_carry_the_contract_in_their_metadata(tmp_path):
    builtin(["tap", "--rank", "4", "--seq", "9", "--out", tmp_path / "f.safetensors"], model_env())
    from safetensors import safe_open
    with safe_open(tmp_path / "f.safetensors", "pt") as f:
        meta = f.metadata()
    assert meta == {"format": "dflash-frame/1", "layer_ids": "1,16,31,46,61", "hidden": "64", "layout": "concat",
                    "dtype": "fp32", "target_layers": "64", "vocab": "256", "producer": "target:4", "seq": "9"}


def test_bf16_frames_and_a_dtype_mismatch(tmp_path):
    bf = model_env(dtype="bf16")
    builtin(["tap", "--out", tmp_path / "f.safetensors"], bf)
    frame = load_file(tmp_path / "f.safetensors")
    assert frame["hidden"].dtype == torch.bfloat16 and frame["hidden"].shape == (1, 64, 320)
    assert builtin(["check-frame", tmp_path / "f.safetensors"], bf).returncode == 0
    r = builtin(["check-frame", tmp_path / "f.safetensors"], model_env(), ok=False)
    assert r.returncode == 65
    assert "dtype differs from [model] dtype" in r.stderr and "found:    BF16" in r.stderr


def test_without_the_contract_it_says_how_to_run_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_")}
    for role in ("target", "drafter"):
        r = run([BUILTIN, role], env=env)
        assert r.returncode == 64
        assert "DFLASH_TAPPED_LAYERS" in r.stderr and "dflash-launch run" in r.stderr
    r = run([BUILTIN, "target"], env=dict(model_env()))
    assert r.returncode == 64 and "DFLASH_SPOOL_DIR is not set" in r.stderr


# --- the C++ drafter against the Python reference ---------------------------------

def python_reference(env):
    c = contract_from_env(env)
    return c, build(c)


def test_drafter_init_is_bit_identical_to_the_reference(tmp_path):
    env = model_env()
    builtin(["init-drafter", "--out", tmp_path / "d.safetensors"], env)
    cpp = load_file(tmp_path / "d.safetensors")
    _, model = python_reference(env)
    sd = model.state_dict()
    assert list(sd) == list(cpp)  # same names, same order
    for k in sd:
        assert torch.equal(sd[k], cpp[k]), k


def test_first_step_loss_agrees_with_the_reference(tmp_path):
    """The same weights (the Python reference's, perturbed so that every tensor
    matters) and the same frame from the builtin target: C++ eager vs Python
    eager, fp32. Tolerance: 1e-5 absolute on a loss of ~5.6 (both run the same
    ATen kernels in the same order; in practice they agree to the last bit)."""
    env = model_env()
    c, model = python_reference(env)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms are no longer ones: a wrong load shows
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "w.safetensors")
    builtin(["tap", "--rank", "1", "--seq", "3", "--out", tmp_path / "f.safetensors"], env)
    r = builtin(["loss", "--weights", tmp_path / "w.safetensors", "--frame", tmp_path / "f.safetensors",
                 "--steps", "3"], env)
    cpp = json.loads(r.stdout)["losses"]
    frame = load_file(tmp_path / "f.safetensors")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    py = []
    for _ in range(3):
        loss = model.loss(frame["hidden"], frame["tokens"])
        py.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"first-step loss C++ {cpp[0]!r} Python {py[0]!r} |diff| {abs(cpp[0] - py[0]):.3g}; "
          f"after 3 AdamW steps |diff| {abs(cpp[2] - py[2]):.3g}")
    assert abs(cpp[0] - py[0]) < 1e-5
    # The optimizer is the same update too (torch.optim.AdamW's single-tensor path on CPU).
    assert max(abs(a - b) for a, b in zip(cpp, py)) < 1e-4


def test_compiled_reference_from_a_warm_up_agrees_on_the_spool(tmp_path):
    """What the demo's Python drafters run. A warm-up (DFLASH_WARMUP=1, as
    `dflash-launch seed` runs it: synthetic source, even for a spool role)
    compiles; the spool run then hits that cache (the same graphs), loads the
    target's shared embedding/LM head, and its first-step loss under
    torch.compile agrees with the C++ drafter's eager one on the same weights
    and frame. Tolerance 1e-4 absolute in fp32 (Inductor fuses differently; the
    metric is rounded to 5 decimals)."""
    env = model_env()
    (tmp_path / "cache").mkdir()
    spool = tmp_path / "spool"
    penv = dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), TORCHINDUCTOR_COMPILE_THREADS="1",
                DFLASH_SOURCE="spool", DFLASH_SPOOL_DIR=str(spool), DFLASH_SPOOL_PRODUCERS="1",
                DFLASH_PROCESS="drafter:0", PYTHONPATH=f"{ROOT / 'python'}:{env.get('PYTHONPATH', '')}")
    drafter = [sys.executable, "-m", "dflash_launch.roles.reference_drafter"]
    r = run(drafter + ["--metrics", tmp_path / "warmup.json"], env=dict(penv, DFLASH_WARMUP="1"), timeout=600)
    assert r.returncode == 0, r.stderr
    warm = json.loads((tmp_path / "warmup.json").read_text())
    assert warm["source"] == "synthetic" and warm["fxgraph_cache_miss"] > 0
    builtin(["target", "--samples", "2"], dict(env, DFLASH_SPOOL_DIR=str(spool), DFLASH_PROCESS="target:0"))
    r = run(drafter + ["--steps", "2", "--metrics", tmp_path / "spool.json"], env=penv, timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "spool.json").read_text())
    assert m["source"] == "spool" and m["steps"] == 2 and m["frames_acked"] == 2
    assert m["fxgraph_cache_miss"] == 0 and m["fxgraph_cache_hit"] > 0  # the warm-up's kernels

    # The same weights for the C++ drafter: its seeded init (= the reference's)
    # with the target's embedding and LM head; the same frame: target:0's seq 0.
    builtin(["init-drafter", "--out", tmp_path / "init.safetensors"], env)
    w = load_file(tmp_path / "init.safetensors")
    w.update(load_file(spool / "weights.safetensors"))
    save_file(w, tmp_path / "w.safetensors")
    builtin(["tap", "--rank", "0", "--seq", "0", "--out", tmp_path / "f.safetensors"], env)
    cpp = json.loads(builtin(["loss", "--weights", tmp_path / "w.safetensors", "--frame",
                              tmp_path / "f.safetensors"], env).stdout)["loss"]
    print(f"first-step loss C++ eager {cpp!r}, Python torch.compile {m['first_loss']!r}, "
          f"|diff| {abs(cpp - m['first_loss']):.3g}")
    assert abs(cpp - m["first_loss"]) < 1e-4


def test_a_frame_that_makes_libtorch_throw_exits_1_not_abort(tmp_path):
    """Token ids outside the vocabulary make LibTorch's embedding throw: the builtin reports it and exits 1
    (its documented runtime failure), instead of aborting with 134 and a core."""
    import struct
    env = model_env()
    builtin(["init-drafter", "--out", tmp_path / "w.safetensors"], env)
    builtin(["tap", "--rank", "0", "--seq", "1", "--out", tmp_path / "f.safetensors"], env)
    data = bytearray((tmp_path / "f.safetensors").read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    a, b = header["tokens"]["data_offsets"]
    data[8 + n + a:8 + n + b] = struct.pack("<q", 10**9) * ((b - a) // 8)
    (tmp_path / "bad.safetensors").write_bytes(bytes(data))
    r = builtin(["loss", "--weights", tmp_path / "w.safetensors", "--frame", tmp_path / "bad.safetensors"], env,
                ok=False)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("dflash-builtin: ") and "frame #" not in r.stderr, r.stderr

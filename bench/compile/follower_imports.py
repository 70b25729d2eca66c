#!/usr/bin/env python3
"""What a precompile follower imports that an eager run of the same step does not, and which line of torch
imports it (issue 22, item 3: the imports are most of what is left of a follower's cost).

One run: a leader on a fresh cache dir compiles the reference drafter's step at the test shapes and saves Dynamo's
artifact; then a follower (loads it) and an eager run (--no-compile) of the same step, each under
`python -X importtime`; then followers under an audit hook that records, for each module, the frames that
asked for it. The experiment ("lean"): a follower whose torch.compile() reads Inductor's config without importing
compile_fx, to show what the artifact's load itself imports. A module is "extra" when the follower imports it
and the eager run does not; an extra module whose importer is not extra is a root, and the table groups every
extra module under its root. Self times are
`-X importtime`'s (which adds its own overhead: compare them with each other, and the CPU line with the
restart bench). CPU: user + sys of the whole process, median of --reps runs each, without importtime.

Usage: python3 bench/compile/follower_imports.py [--reps 3] [--out docs/benchmarks.md]
"""
import argparse
import datetime
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADING = "## compile gate: the imports a precompile follower pays for, and who asks for them"
sys.path.insert(0, str(ROOT / "bench" / "compile"))
from follower_split import SHAPES as SPLIT_SHAPES  # noqa: E402  (the same step as the phase-by-phase bench)
SHAPES = dict(SPLIT_SHAPES, n_taps=5, hidden_shape=[1, 64, 320])
IMPORTLIB = ("<frozen importlib", "importlib/__init__", "follower_imports.py")


def record_import_sites(path):
    """Audit hook: module -> the 3 innermost frames outside importlib that imported it, written at exit."""
    import atexit
    import traceback
    sites = {}

    def hook(event, args):
        if event == "import" and args[0] not in sites:
            frames = [f for f in traceback.extract_stack() if not any(s in f.filename for s in IMPORTLIB)]
            sites[args[0]] = [f"{short(f.filename)}:{f.lineno} {f.name}" for f in frames[-3:]]
    sys.addaudithook(hook)
    atexit.register(lambda: pathlib.Path(path).write_text(json.dumps(sites)))


def short(filename):
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1]
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", "//") in filename:
        return "<cache>/" + pathlib.Path(filename).name + " (Inductor's generated wrapper)"
    return pathlib.Path(filename).name


def skip_compile_fx_for_the_config():
    """The experiment: torch.compile() imports compile_fx only to read Inductor's patched config
    (get_patched_config_dict); read it from torch._inductor.config alone, to see what the load itself imports."""
    import torch

    def get_compiler_config(self):
        from torch._inductor import config
        with config.patch(self.config):
            return config.get_config_copy()
    torch._TorchCompileInductorWrapper.get_compiler_config = get_compiler_config


def child(role):
    if os.environ.get("IMPORT_SITES"):
        record_import_sites(os.environ["IMPORT_SITES"])
    import torch
    sys.path.insert(0, str(ROOT / "python"))
    from dflash_launch.reference_drafter import SyntheticSource, build
    torch.set_num_threads(1)
    model = build(SHAPES)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    if role == "lean":
        skip_compile_fx_for_the_config()
    step = model.loss if role == "eager" else torch.compile(model.loss)
    sample = next(iter(SyntheticSource(SHAPES, 0, torch.float32)))
    loss = step(sample["hidden"], sample["tokens"])
    loss.backward()
    opt.step()
    if role == "leader":
        torch.compiler.save_cache_artifacts()
    from torch._dynamo.utils import counters
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"loss": loss.item(), "dynamo_hits": int(counters["dynamo_cache"]["dynamo_cache_hit"]),
                      "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}))


def spawn(cache, role, importtime=False, sites=None):
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASH_GATE_ROLE", "DFLASH_PAYLOAD_HOOK")}
    (cache / ".dflash").mkdir(mode=0o700, exist_ok=True)  # the gate's dir, as dflash-worker makes it
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TORCH_CACHING_PRECOMPILE="1",
               TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1")
    if role != "eager":  # gated, as under dflash-launch: the payload hook loads (and shares the ISA verdicts)
        env["DFLASH_GATE_ROLE"] = "lead" if role == "leader" else "reuse"
    if sites:
        env["IMPORT_SITES"] = str(sites)
    cmd = [sys.executable] + (["-X", "importtime"] if importtime else []) + [__file__, "--child", role]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{role} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def import_tree(stderr):
    """`-X importtime` lines -> [(module, depth, self_us)], children before their parent, as printed."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|", 2)
        if not self_us.strip().isdigit():
            continue  # the header
        out.append((name.strip(), (len(name) - len(name.lstrip())) // 2, int(self_us)))
    return out


def roots_of(tree, extra):
    """Extra module -> its root: the outermost extra module on its import chain."""
    roots, pending = {}, []  # pending: (name, depth, children) of modules whose parent is not printed yet
    for name, depth, _ in tree:
        kids = [p for p in pending if p[1] > depth]
        pending = [p for p in pending if p[1] <= depth] + [(name, depth, kids)]
    def walk(node, root):
        name, _, kids = node
        r = root or (name if name in extra else None)
        if name in extra:
            roots[name] = r
        for k in kids:
            walk(k, r)
    for node in pending:
        walk(node, None)
    return roots


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    cache = pathlib.Path(tempfile.mkdtemp(prefix="follower_imports_"))
    try:
        print("leader ...", file=sys.stderr, flush=True)
        leader, _ = spawn(cache, "leader")
        follower, f_err = spawn(cache, "follower", importtime=True)
        eager, e_err = spawn(cache, "eager", importtime=True)
        lean, l_err = spawn(cache, "lean", importtime=True)
        sites, lean_sites = ({}, {})
        for role, into in (("follower", sites), ("lean", lean_sites)):
            spawn(cache, role, sites=cache / f"{role}.sites.json")
            into.update(json.loads((cache / f"{role}.sites.json").read_text()))
        cpu = {"follower": [], "eager": []}
        for _ in range(args.reps):  # interleaved, so that the machine's load hits them alike
            for role in cpu:
                cpu[role].append(spawn(cache, role)[0]["cpu_s"])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    f_tree, e_tree = import_tree(f_err), import_tree(e_err)
    e_names = {n for n, _, _ in e_tree}
    self_us = {n: s for n, _, s in f_tree}
    extra = {n for n in self_us if n not in e_names}
    roots = roots_of(f_tree, extra)
    groups = {}
    for name in extra:
        groups.setdefault(roots[name], []).append(name)
    ordered = sorted(groups.items(), key=lambda kv: -sum(self_us[n] for n in kv[1]))
    rows = []
    for root, names in ordered[:8]:
        heavy = sorted(names, key=lambda n: -self_us[n])[:3]
        site = " ← ".join(reversed(sites.get(root, ["interpreter start (before the audit hook: a `.pth`)"])))
        rows.append(f"| `{root}` | {len(names)} | {sum(self_us[n] for n in names) / 1e3:.0f} | "
                    f"{', '.join(f'`{n}` {self_us[n] / 1e3:.0f}' for n in heavy)} | {site} |")
    rest = ordered[8:]
    rows.append(f"| {len(rest)} other roots | {sum(len(v) for _, v in rest)} | "
                f"{sum(self_us[n] for _, v in rest for n in v) / 1e3:.0f} | | |")
    total_extra = sum(self_us[n] for n in extra) / 1e3
    l_self = {n: s for n, _, s in import_tree(l_err)}
    l_extra = {n for n in l_self if n not in e_names}
    heavy = ("torch._inductor.decomposition", "torch._inductor.select_algorithm", "torch._inductor.lowering")
    still = [f"`{n}` ({l_self[n] / 1e3:.0f} ms self), asked for by {' ← '.join(reversed(lean_sites.get(n, ['?'])))}"
             for n in heavy if n in l_extra]
    med = {role: statistics.median(v) for role, v in cpu.items()}
    l_total = sum(l_self[n] for n in l_extra) / 1e3
    same = follower["loss"] == leader["loss"]
    follower_facts = f"Dynamo hits: {follower['dynamo_hits']}; first loss equal to the leader's: {same}"
    lean_facts = f"Dynamo hits: {lean['dynamo_hits']}; first loss equal: {lean['loss'] == leader['loss']}"
    load = os.getloadavg()
    cmd = "python3 bench/compile/follower_imports.py " + " ".join(sys.argv[1:])
    md = f"""{HEADING}

`{cmd.strip()}` — {datetime.date.today()}, this 2-core machine shared with other work (load average {load[0]:.1f}
at the end), torch {__import__('torch').__version__} (CPU). The reference drafter's step at the test shapes,
`TORCH_CACHING_PRECOMPILE=1`, gated processes as under dflash-launch (the payload hook loads and answers the ISA
probe from the leader's verdicts), the eager run ungated. A leader saves the artifact; a follower that loads it
({follower_facts}) and an eager run of the same step run under `-X importtime`; the frames that asked for each
module come from two more followers under an audit hook.

- Whole process, CPU s, median of {args.reps} (no importtime): follower {med['follower']:.2f}, eager
  {med['eager']:.2f}; the follower pays {med['follower'] - med['eager']:.2f} s more
  ({med['follower'] / med['eager']:.2f}x).
- The follower imports {len(extra)} modules the eager run does not ({len(f_tree)} against {len(e_tree)}):
  {total_extra:.0f} ms of self time under importtime.
- The same follower with `torch.compile()` kept from importing `compile_fx` (it only reads Inductor's config
  there; the bench reads it from `torch._inductor.config`), {lean_facts}: it still imports {len(l_extra)} extra
  modules, {l_total:.0f} ms of self time. The load itself asks for the heavy ones:
{chr(10).join("  - " + x for x in still)}

| root (first extra module on the chain) | modules under it | self ms | heaviest, self ms | asked for by (outermost first) |
|---|---|---|---|---|
{chr(10).join(rows)}
"""
    print(md)
    if args.out:
        sys.path.insert(0, str(ROOT / "bench"))
        from benchmarks_md import write_section  # noqa: E402
        write_section(args.out, HEADING, md)


if __name__ == "__main__":
    main()

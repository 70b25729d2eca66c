"""The end of `make demo`: what the run did, in one screen, and a loss curve.

    python -m dflash_launch.tools.demo_report runs/<run_id>

Reads <run_dir>/summary.json (the supervisor's) and <run_dir>/spool.json (the
spool's manifest, written by the drafter that acknowledged the last frame),
prints per drafter its compile-gate role, compile time, cache hits, samples
consumed and first -> last loss; per target the frames it published; whether
every frame was consumed exactly once; and writes <run_dir>/loss.png.
Exit status 0 when the run succeeded, every frame was consumed exactly once
and every drafter's loss fell; 1 otherwise.
"""

import json
import os
import sys

from dflash_launch._extras import require


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def _fell(losses, k=10):
    """Mean of the last k losses below the mean of the first k (noise-proof 'it learned')."""
    if len(losses) < 2 * k:
        k = max(1, len(losses) // 4)
    return len(losses) >= 2 and _mean(losses[-k:]) < _mean(losses[:k])


def _seconds(s):
    if s is None:
        return "-"
    return f"{s:.1f}s" if s < 60 else f"{int(s) // 60}m{int(s) % 60:02d}s"


def load(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    spool = None
    path = os.path.join(run_dir, "spool.json")
    if os.path.exists(path):
        with open(path) as f:
            spool = json.load(f)
    return summary, spool


def drafter_rows(summary):
    rows = []
    for p in summary["processes"]:
        m = p.get("metrics") or {}
        if p["role"] == "target" or m.get("role") == "target":
            continue
        gate = p.get("gate") or {}
        impl = "C++ eager" if m.get("impl") == "builtin" else "Python torch.compile"
        if m.get("impl") != "builtin" and m.get("compile_wall_s") is None:
            impl = "Python"
        hits = (f"{m['fxgraph_cache_hit']}/{m['fxgraph_cache_miss']}" if "fxgraph_cache_hit" in m else "-")
        losses = m.get("losses") or []
        rows.append({
            "name": p["name"], "impl": impl, "gate": gate.get("role") or "-",
            "compile": m.get("compile_wall_s") if m.get("impl") != "builtin" else None,
            "hits": hits, "samples": m.get("samples", 0), "taken_back": m.get("taken_back", 0),
            "first": losses[0] if losses else None, "last": losses[-1] if losses else None,
            "last_avg": _mean(losses[-20:]) if losses else None,
            "losses": losses, "fell": _fell(losses), "restarts": p.get("restarts", 0),
            "exit": p.get("exit_code"),
        })
    return rows


def target_rows(summary):
    rows = []
    for p in summary["processes"]:
        m = p.get("metrics") or {}
        if m.get("role") == "target":
            rows.append({"name": p["name"], "frames": m.get("next_seq", m.get("frames", 0)),
                         "forward_ms": 1000 * m["forward_s"] / m["frames"] if m.get("frames") else None,
                         "waited": m.get("backpressure_wait_s") or 0, "restarts": p.get("restarts", 0)})
    return rows


def plot(rows, path, title):
    matplotlib = require("matplotlib", "the demo report's plot")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", "the demo report's plot")

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for r in rows:
        if not r["losses"]:
            continue
        xs = range(len(r["losses"]))
        line, = ax.plot(xs, r["losses"], alpha=0.25, linewidth=0.8)
        k = max(1, len(r["losses"]) // 25)
        smooth = [_mean(r["losses"][max(0, i - k):i + 1]) for i in xs]
        ax.plot(xs, smooth, color=line.get_color(), linewidth=2,
                label=f"{r['name']} ({r['impl']}{', ' + r['gate'] if r['gate'] != '-' else ''}): "
                      f"{r['first']:.2f} -> {r['last_avg']:.2f} (last 20)")
    ax.set_xlabel("step (one frame from the spool each)")
    ax.set_ylabel("block-weighted cross-entropy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(run_dir, out=sys.stdout):
    summary, spool = load(run_dir)
    drafters, targets = drafter_rows(summary), target_rows(summary)
    w = out.write
    ok = summary.get("exit_code") == 0
    w(f"\n== DFlash demo: {summary['run_id']} ({_seconds(summary.get('wall_s'))}) ==\n\n")
    w(f"{'drafter':<12}{'runs as':<22}{'gate':<7}{'compile':>8}  {'fx hit/miss':<12}{'samples':>8}"
      f"  {'loss first -> last':<20}{'last 20 avg':<13}{'learned':<8}\n")
    for r in drafters:
        loss = f"{r['first']:.3f} -> {r['last']:.3f}" if r["first"] is not None else "-"
        avg = f"{r['last_avg']:.3f}" if r["last_avg"] is not None else "-"
        extra = f"  (restarted {r['restarts']}x, took back {r['taken_back']})" if r["restarts"] else ""
        w(f"{r['name']:<12}{r['impl']:<22}{r['gate']:<7}{_seconds(r['compile']):>8}  {r['hits']:<12}"
          f"{r['samples']:>8}  {loss:<20}{avg:<13}{'yes' if r['fell'] else 'NO':<8}{extra}\n")
    gated = [r for r in drafters if r["gate"] in ("lead", "reuse")]
    leads = [r for r in gated if r["gate"] == "lead"]
    # Gate mode "warmup": one warm-up compiled before the drafters started.
    warm = [p for p in summary.get("warmups", []) if (p.get("gate") or {}).get("role") == "lead"]
    if gated:
        others = [r for r in gated if r["gate"] == "reuse" and r["compile"]]
        reused = (f"{len(others)} reused its kernels from the cache"
                  + (f" in {_seconds(_mean([r['compile'] for r in others]))} each" if others else "") + ".\n")
        if leads:
            lead = leads[0]
            w(f"\ncompile gate: {lead['name']} compiled in {_seconds(lead['compile'])}; " + reused)
        elif warm:
            w(f"\ncompile gate: {warm[0]['name']} compiled in {_seconds(warm[0]['gate'].get('compile_s'))} "
              f"before the drafters started; " + reused)
        else:
            w("\ncompile gate: the cache was already warm (an earlier run compiled): every drafter reused it.\n")
    if targets:
        total = sum(t["frames"] for t in targets)
        fwd = [t["forward_ms"] for t in targets if t["forward_ms"]]
        waited = sum(t["waited"] for t in targets)
        w(f"targets: {len(targets)} builtin LibTorch targets published {total} frames"
          + (f" ({_mean(fwd):.0f} ms per forward on the shared cores" if fwd else " (")
          + f"; paused {waited:.0f}s in all while the spool was full).\n")
    if spool:
        pub, con = spool["frames_published"], spool["frames_consumed"]
        verdict = "every frame consumed exactly once" if spool.get("exactly_once") else "NOT exactly once"
        w(f"spool: {pub} frames produced, {con} consumed: {verdict}"
          + (f"; rejected {len(spool['rejected'])}" if spool.get("rejected") else "") + ".\n")
    else:
        w("spool: no manifest (spool.json): the spool did not reach its final state.\n")
    png = os.path.join(run_dir, "loss.png")
    if any(r["losses"] for r in drafters):
        plot(drafters, png, f"DFlash drafters on builtin-target hidden states ({summary['run_id']})")
        w(f"loss curve: {png}\n")
    if not ok:
        w(f"run failed: exit {summary.get('exit_code')}, {summary.get('reason')}\n")
    good = ok and bool(spool and spool.get("exactly_once")) and bool(drafters) and all(r["fell"] for r in drafters)
    return 0 if good else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m dflash_launch.tools.demo_report <run_dir>")
    sys.exit(report(argv[0]))


if __name__ == "__main__":
    main()

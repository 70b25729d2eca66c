"""A drafter for bench/ctl/restart_compiled_bench.py: the reference drafter's model and step
(python/dflash_launch/roles/reference_drafter.py), torch.compile'd unless --no-compile, one training step, then
READY=1 (dflash_launch.notify_ready()) and idle until stopped, like a drafter waiting for the targets' next batch.

At its first step it writes $BENCH_OUT/<process>.<pid>.json: the CPU of its whole process tree from exec
(user + sys of itself and its reaped children: the g++ kernel builds and Inductor's ISA probe), imports
included, and its cache counters."""
import json
import os
import resource
import signal
import sys
import time


def tree_cpu_s():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main():
    compiled = "--no-compile" not in sys.argv[1:]
    import torch
    from dflash_launch import contract_from_env, notify_ready
    from dflash_launch.roles.reference_drafter import SyntheticSource, build, cache_counters
    torch.set_num_threads(1)  # the same in every process
    contract = contract_from_env()
    model = build(contract)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    step = torch.compile(model.loss) if compiled else model.loss
    sample = next(iter(SyntheticSource(contract, int(os.environ.get("ROLE_RANK", "0")), torch.float32)))
    loss = step(sample["hidden"], sample["tokens"])
    loss.backward()
    opt.step()
    facts = {"cpu_s": round(tree_cpu_s(), 3), "loss": round(loss.item(), 6), "compiled": compiled}
    if compiled:
        facts.update(cache_counters())
    out = os.environ["BENCH_OUT"]
    name = os.environ.get("DFLASH_PROCESS", "drafter").replace(":", "_")
    with open(os.path.join(out, f"{name}.{os.getpid()}.json"), "w") as f:
        json.dump(facts, f)
    notify_ready(f"first step, loss {facts['loss']:.4f}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

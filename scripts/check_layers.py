#!/usr/bin/env python3
"""Dependencies run one way: each module's #include "x/..." lines may name only its own module or a lower
layer (docs/design.md, "Layers"), and the pure rooms (FORBIDDEN: the supervisor's core, the report) include no
logger, no OS call and no gate. Run by ctest (`layers`); `--self-test` plants violations in a scratch tree
and checks that each one is caught (ctest `layers_catch_a_planted_violation`).

    python3 scripts/check_layers.py [ROOT]      # exit 0: clean; 1: each violation as file:line: why
"""
import os
import re
import sys
import tempfile

# module (a folder under the root) -> layer. A module may include its own files and those of lower layers;
# two modules of one layer never include each other. Most specific folder first.
LAYERS = [
    ("common", 0),          # OS helpers: fds, spawn, notify, durations, hashes
    ("contract", 1),        # what the processes agree on: shapes, readiness, shared defaults (no I/O)
    ("store", 1),           # the Redis client: multi-node coordination, the cluster-wide gate
    ("spool", 1.5),         # the hidden-state spool's one implementation (no LibTorch): roles, metrics, Python
    ("cachelock", 2),       # the compile gate, its CLI, cache archives, the cluster lease (uses store/)
    ("worker/builtin", 2),  # the LibTorch roles: payloads like any other, they know no gate nor worker
    ("worker", 3),          # dflash-worker, dflash-cachelock-run, the worker's wire protocol
    # dflash-launch, in rooms; the arrows between rooms are checked like the layers are
    ("launcher/config", 4.0),     # run.toml: schema, reader, errors
    ("launcher/plan", 4.1),       # the plan: processes, environments, ports, gate keys
    ("launcher/control", 4.2),    # the control socket, the registry of live runs
    ("launcher/core", 4.25),      # the supervisor's pure core: decisions, actions, the verdict (no fd)
    ("launcher/console", 4.3),    # logs and the live view
    ("launcher/report", 4.3),     # the run's report: summary.json, the tables, the loss plot
    ("launcher/metrics", 4.35),   # Prometheus metrics of a live run
    ("launcher/supervise", 4.4),  # the supervisor's epoll shell, kill-on-death
    ("launcher/cluster", 4.4),    # multi-node: the node coordinator, peers, the private store
    ("launcher/commands", 4.5),   # the CLI
    ("launcher", 4),              # nothing may live here outside a room (a new room is registered above)
]
# What a room may not include whatever its layer: the supervisor's core decides and the report formats; neither
# logs (spdlog), calls the OS (only <sys/types.h> for pid_t) or touches the compile gate (cachelock/).
PURE = re.compile(r"^(spdlog/|cachelock/|sys/(?!types\.h$)|unistd\.h$|fcntl\.h$|poll\.h$|dirent\.h$|signal\.h$|"
                  r"pthread\.h$|arpa/|netinet/|linux/)")
FORBIDDEN = {
    "launcher/core": (PURE, "the supervisor's core decides and does nothing itself: no log, no syscall, no gate "
                            "(its epoll shell, launcher/supervise, carries its actions out)"),
    "launcher/report": (PURE, "the report only formats a RunSummary: no log, no syscall, no gate"),
}
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^>"]+)[>"]')
ROOMS = ", ".join(n.split("/")[1] for n, _ in LAYERS if n.startswith("launcher/"))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cpp", ".hpp")


def chain():
    """"common <- contract <- cachelock | worker/builtin <- worker <- launcher"."""
    by_layer = {}
    for name, layer in LAYERS:
        by_layer.setdefault(layer, []).append(name)
    return " <- ".join(" | ".join(names) for _, names in sorted(by_layer.items()))


def module_of(rel):
    """The module a path (relative to the root, with '/') belongs to, or None if it is in none."""
    for name, layer in LAYERS:
        if rel == name or rel.startswith(name + "/"):
            return name, layer
    return None


def violations(root):
    found = []
    for name, layer in LAYERS:
        base = os.path.join(root, name)
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                own = module_of(rel)
                if own is None or own[0] != name:
                    continue  # a file of a more specific module (worker/builtin under worker): checked as that
                if name == "launcher":
                    found.append(f"{rel}:1: launcher/ holds its code in rooms ({ROOMS}): put it in one, or "
                                 f"register a new room in scripts/check_layers.py")
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        any_m = ANY_INCLUDE.match(line)
                        if any_m and name in FORBIDDEN and FORBIDDEN[name][0].match(any_m.group(1)):
                            found.append(f"{rel}:{n}: {name} may not include {any_m.group(1)}: {FORBIDDEN[name][1]}")
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        target = module_of(m.group(1))
                        if target is None or target[0] == name:
                            continue
                        if target[1] >= layer:
                            found.append(f"{rel}:{n}: {name} (layer {layer}) includes {m.group(1)} of {target[0]} "
                                         f"(layer {target[1]}): dependencies run one way, "
                                         f"{chain()} (docs/design.md, \"Layers\")")
    return found


def self_test():
    """Each planted include must be caught; a clean tree must pass."""
    plants = [
        ("cachelock/cli.cc", '#include "worker/gated_run.h"'),
        ("cachelock/gate.h", '#include "launcher/plan/plan.h"'),
        ("common/spawn.cc", '#include "contract/ready_spec.h"'),
        ("common/fd.h", '#include "cachelock/gate.h"'),
        ("store/redis_client.cc", '#include "launcher/plan/plan.h"'),
        ("contract/readiness.cc", '#include "worker/protocol.h"'),
        ("worker/builtin/roles.cc", '#include "cachelock/gate.h"'),  # same layer, another module
        ("spool/spool.cc", '#include "worker/builtin/model.h"'),  # the spool knows no role that uses it
        ("worker/main.cc", '#include "launcher/supervise/supervisor.h"'),
        ("launcher/plan/plan.cc", '#include "launcher/supervise/supervisor.h"'),  # a room's arrow upward
        ("launcher/cluster/peer_tracker.h", '#include "launcher/supervise/supervisor.h"'),  # a sibling room
        ("launcher/stray.cc", '#include "launcher/config/config.h"'),  # outside any room
        ("launcher/core/incident.cc", '#include <spdlog/spdlog.h>'),  # the pure core logs nothing
        ("launcher/core/process_unit.cc", '#include <sys/wait.h>'),  # nor calls the OS
        ("launcher/core/start_order.cc", '#include <unistd.h>'),
        ("launcher/report/summary_json.cc", '#include "cachelock/cache_inventory.h"'),  # nor touches the gate
    ]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as fh:
                fh.write(text)

        clean = {
            "common/fd.h": "#pragma once\n#include <string>\n",
            "contract/readiness.cc": '#include "contract/readiness.h"\n#include "common/fd.h"\n',
            "cachelock/gate.h": '#include "contract/defaults.h"\n#include "common/fd.h"\n',
            "worker/builtin/roles.cc": '#include "worker/builtin/model.h"\n#include "contract/shape_contract.h"\n',
            "spool/spool.cc": '#include "spool/spool_ring.h"\n#include "contract/shape_contract.h"\n',
            "worker/main.cc": '#include "cachelock/gate.h"\n#include "spool/frame_contract.h"\n',
            "launcher/plan/plan.cc": '#include "worker/protocol.h"\n#include "launcher/config/config.h"\n',
            "launcher/cluster/peer_tracker.h": '#include "launcher/plan/plan.h"\n#include "common/duration.h"\n',
            "launcher/core/incident.cc": '#include <sys/types.h>\n#include <csignal>\n#include "launcher/plan/plan.h"\n',
            "launcher/core/process_unit.cc": '#include "common/duration.h"\n',
            "launcher/core/start_order.cc": '#include <algorithm>\n',
            "launcher/report/summary_json.cc": '#include "launcher/core/run_verdict.h"\n#include "common/human_bytes.h"\n',
        }
        for rel, text in clean.items():
            write(rel, text)
        if violations(root):
            failures.append(f"a clean tree was refused: {violations(root)}")
        for rel, line in plants:
            before = open(os.path.join(root, rel)).read() if os.path.exists(os.path.join(root, rel)) else None
            write(rel, (before or "") + "// planted\n" + line + "\n")
            got = violations(root)
            want = f"{rel}:"
            target = ANY_INCLUDE.match(line).group(1)
            if not any(v.startswith(want) and target in v for v in got):
                failures.append(f"not caught: {line} in {rel} (got {got})")
            if before is None:
                os.remove(os.path.join(root, rel))
            else:
                write(rel, before)
    for f in failures:
        print("self-test:", f)
    print("self-test:", "ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


def main(argv):
    if argv[1:2] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) against the layers")
        return 1
    print("layers: every include runs downward")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

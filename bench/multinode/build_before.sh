#!/bin/sh
# The "before" side of scale_bench.py: the coordinator of an earlier commit (default: the one before
# issue #58's watcher, 22433aa) built into its own coordinator_swarm_bench, against this build's other
# libraries (the coordinator's interface did not change). Usage: bench/multinode/build_before.sh [COMMIT] [OUT]
set -eu
commit=${1:-22433aa}
out=${2:-/tmp/dflash-swarm-before}
root=$(cd "$(dirname "$0")/../.." && pwd)
src="$out/src"
rm -rf "$src"
mkdir -p "$src/launcher/cluster" "$src/store"
for f in node_coordinator.h node_coordinator.cc node_coordinator_watch.cc node_store_scripts.h peer_tracker.h \
         peer_tracker.cc store_records.h store_records.cc store_rules.h store_rules.cc; do
  git -C "$root" show "$commit:launcher/cluster/$f" > "$src/launcher/cluster/$f"
done
b="$root/build"
flags="-DFMT_SHARED -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1
       -DSWARM_NO_ROLES -I$src -I$b/generated -I$root -O2 -DNDEBUG -std=c++20"
# shellcheck disable=SC2086
c++ $flags -o "$out/coordinator_swarm_bench" "$root/bench/multinode/coordinator_swarm.cc" \
  "$src"/launcher/cluster/*.cc \
  "$b/launcher/core/libdflash_launch_core.a" "$b/launcher/control/libdflash_launch_control.a" \
  "$b/launcher/plan/libdflash_launch_plan.a" "$b/launcher/config/libdflash_launch_config.a" \
  "$b/worker/libdflash_worker_protocol.a" "$b/contract/libdflash_contract.a" -ltomlplusplus -ldl \
  "$b/store/libdflash_store.a" "$b/common/libdflash_common.a" -lcrypto -lhiredis -lspdlog -lfmt -lpthread
echo "$out/coordinator_swarm_bench"

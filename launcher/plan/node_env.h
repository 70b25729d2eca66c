// Where this dflash-launch sits among the run's nodes: from the flags
// (--nnodes/--node-rank/--master-addr, torchrun's names), else from the
// scheduler that placed it (Slurm's srun, Kubernetes' PyTorchJob/JobSet/Indexed
// Job env), else [run] and a single node. See docs/multinode.md.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "launcher/plan/plan.h"

namespace dflash {

struct NodeFlags {
  int nnodes = 0;          // 0: not given
  int node_rank = -1;      // -1: not given
  std::string master_addr; // empty: not given
  std::string store;       // --store: "private" or redis://...; empty: [run] store
};

struct NodeSetup {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: [run] master_addr
  int master_port = -1;     // -1: [run] master_port (the scheduler's MASTER_PORT otherwise)
  std::string run_id;       // the scheduler's job id as a run id suffix ("slurm-1234.0"); empty: none
  std::string source;       // "flags", "slurm", "kubernetes", "config", "single node"
};

/// Runs argv (PATH lookup, no shell), its stdout into `out`. False: `err` says why.
using CommandOutput = std::function<bool(const std::vector<std::string>& argv, std::string* out, std::string* err)>;
bool RunForOutput(const std::vector<std::string>& argv, std::string* out, std::string* err);

/// Combines the flags, the scheduler's environment and [run]: flags first, then
/// [run] master_addr if written, then the scheduler. Under Slurm the master is
/// the step's first node (`scontrol show hostnames`), resolved to its NodeAddr
/// (`scontrol show node`), since a Slurm node name need not be a DNS name.
/// False: `err` says what is wrong and how to fix it (exit 64).
bool ResolveNodeSetup(const NodeFlags& flags, const RunSpec& run, const EnvList& env, const CommandOutput& command,
                      NodeSetup* out, std::string* err);

}  // namespace dflash

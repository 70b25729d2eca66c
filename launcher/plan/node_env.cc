#include "launcher/plan/node_env.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "common/fd.h"

extern char** environ;

namespace dflash {
namespace {

std::optional<std::string> Get(const EnvList& env, const char* name) {
  std::optional<std::string> v;
  for (const auto& [k, val] : env)
    if (k == name) v = val;  // the last one wins, as getenv's environment would have it
  return v;
}

bool ParseInt(const std::string& s, int* out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && p == end && !s.empty();
}

/// An integer variable, or a clear error naming it.
bool IntVar(const EnvList& env, const char* name, int min, std::optional<int>* out, std::string* err) {
  std::optional<std::string> v = Get(env, name);
  if (!v) return true;
  int n = 0;
  if (!ParseInt(*v, &n) || n < min) {
    *err = std::string(name) + "=\"" + *v + "\" is not " + (min > 0 ? "a positive" : "a non-negative") +
           " integer" + (v->find(':') != std::string::npos ? " (elastic ranges like 1:4 are not supported: "
                                                             "dflash-launch runs a fixed number of nodes)"
                                                           : "");
    return false;
  }
  *out = n;
  return true;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = s.find_first_not_of(" \t");
  return i == std::string::npos ? "" : s.substr(i);
}

/// The first host of a Slurm node list ("n[1-2]" -> "n1") as an address.
bool SlurmMaster(const std::string& nodelist, const CommandOutput& command, std::string* addr, std::string* err) {
  std::string out;
  if (!command({"scontrol", "show", "hostnames", nodelist}, &out, err)) {
    *err = "cannot expand the Slurm node list \"" + nodelist + "\" with `scontrol show hostnames`: " + *err +
           " (or pass --master-addr HOST)";
    return false;
  }
  std::string first = Trim(out.substr(0, out.find('\n')));
  if (first.empty()) {
    *err = "`scontrol show hostnames " + nodelist + "` printed no host (pass --master-addr HOST)";
    return false;
  }
  // A node name is not necessarily resolvable: NodeAddr is what Slurm itself connects to.
  *addr = first;
  std::string node;
  if (command({"scontrol", "show", "node", first}, &node, err)) {
    size_t at = node.find("NodeAddr=");
    if (at != std::string::npos) {
      size_t start = at + std::strlen("NodeAddr=");
      std::string v = node.substr(start, node.find_first_of(" \t\n", start) - start);
      if (!v.empty() && v != "(null)") *addr = v;
    }
  }
  err->clear();
  return true;
}

}  // namespace

bool RunForOutput(const std::vector<std::string>& argv, std::string* out, std::string* err) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    *err = ErrnoMessage("pipe2", errno);
    return false;
  }
  UniqueFd rd(fds[0]), wr(fds[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);  // dup2 clears O_CLOEXEC on fd 1 only
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  wr.reset();
  if (rc != 0) {
    *err = ErrnoMessage(argv[0], rc);
    return false;
  }
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(rd.get(), buf, sizeof buf);
    if (n > 0) out->append(buf, static_cast<size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    *err = argv[0] + (WIFEXITED(status) ? " exited " + std::to_string(WEXITSTATUS(status))
                                        : " was killed by signal " + std::to_string(WTERMSIG(status)));
    return false;
  }
  return true;
}

bool ResolveNodeSetup(const NodeFlags& flags, const RunSpec& run, const EnvList& env, const CommandOutput& command,
                      NodeSetup* out, std::string* err) {
  NodeSetup s;
  std::optional<int> nnodes, rank;
  std::string scheduler;
  std::string slurm_nodelist;
  std::string sched_addr;
  // Slurm: a launcher started by srun (one task per node).
  if (Get(env, "SLURM_JOB_ID") && Get(env, "SLURM_NNODES") && Get(env, "SLURM_NODEID")) {
    if (!IntVar(env, "SLURM_NNODES", 1, &nnodes, err) || !IntVar(env, "SLURM_NODEID", 0, &rank, err)) return false;
    scheduler = "slurm";
    std::optional<std::string> step = Get(env, "SLURM_STEP_ID");
    if (*nnodes > 1 && !step && flags.nnodes == 0) {
      *err = "SLURM_NNODES=" + std::to_string(*nnodes) +
             " but this is not an srun step (no SLURM_STEP_ID): start one dflash-launch per node with "
             "`srun --ntasks-per-node=1 dflash-launch ...` (see examples/slurm/)";
      return false;
    }
    std::optional<int> tasks, step_nodes;
    if (!IntVar(env, "SLURM_STEP_NUM_TASKS", 1, &tasks, err) ||
        !IntVar(env, "SLURM_STEP_NUM_NODES", 1, &step_nodes, err))
      return false;
    if (tasks && step_nodes && *tasks != *step_nodes && flags.nnodes == 0) {
      *err = "this srun step has " + std::to_string(*tasks) + " tasks on " + std::to_string(*step_nodes) +
             " nodes: dflash-launch starts every process of its node itself, so run exactly one per node "
             "(srun --ntasks-per-node=1)";
      return false;
    }
    slurm_nodelist = Get(env, "SLURM_STEP_NODELIST").value_or(Get(env, "SLURM_JOB_NODELIST").value_or(""));
    s.run_id = "slurm-" + *Get(env, "SLURM_JOB_ID") + (step ? "." + *step : "");
  } else if (Get(env, "NNODES") || Get(env, "PET_NNODES")) {
    // Kubernetes: PyTorchJob (PET_*), or a JobSet / Indexed Job whose manifest sets NNODES and
    // takes the pod's index from JOB_COMPLETION_INDEX.
    const char* n_var = Get(env, "PET_NNODES") ? "PET_NNODES" : "NNODES";
    if (!IntVar(env, n_var, 1, &nnodes, err)) return false;
    const char* r_var = Get(env, "PET_NODE_RANK") ? "PET_NODE_RANK"
                        : Get(env, "NODE_RANK")   ? "NODE_RANK"
                                                  : "JOB_COMPLETION_INDEX";
    if (!IntVar(env, r_var, 0, &rank, err)) return false;
    if (!rank && *nnodes > 1 && flags.node_rank < 0) {
      *err = std::string(n_var) + "=" + std::to_string(*nnodes) +
             " but no node rank: set NODE_RANK (or run as an Indexed Job: JOB_COMPLETION_INDEX), or pass --node-rank";
      return false;
    }
    sched_addr = Get(env, "PET_MASTER_ADDR").value_or(Get(env, "MASTER_ADDR").value_or(""));
    std::optional<int> port;
    const char* p_var = Get(env, "PET_MASTER_PORT") ? "PET_MASTER_PORT" : "MASTER_PORT";
    if (!IntVar(env, p_var, 1, &port, err)) return false;
    if (port && *port > 65535) {
      *err = std::string(p_var) + "=" + std::to_string(*port) + " is not a port";
      return false;
    }
    if (port && run.master_port == 0) s.master_port = *port;
    scheduler = "kubernetes";
  }

  // Flags first, then the scheduler, then [run] nnodes.
  s.source = scheduler.empty() ? "single node" : scheduler;
  if (flags.nnodes > 0) {
    s.nnodes = flags.nnodes;
    s.source = "flags";
  } else if (nnodes) {
    s.nnodes = *nnodes;
  } else if (run.nnodes > 0) {
    s.nnodes = run.nnodes;
    s.source = "config";
  }
  if (flags.node_rank >= 0) s.node_rank = flags.node_rank;
  else if (rank && (flags.nnodes == 0 || flags.nnodes == *nnodes)) s.node_rank = *rank;
  else if (s.nnodes > 1) {
    *err = "this launcher is one of " + std::to_string(s.nnodes) +
           " nodes but does not know which: pass --node-rank R (0.." + std::to_string(s.nnodes - 1) +
           "), or start it under srun or with NODE_RANK set";
    return false;
  }

  // MASTER_ADDR: --master-addr, else [run] master_addr if written, else the scheduler's.
  if (!flags.master_addr.empty()) {
    s.master_addr = flags.master_addr;
  } else if (!run.master_addr_given && s.nnodes > 1) {
    if (!sched_addr.empty()) {
      s.master_addr = sched_addr;
    } else if (!slurm_nodelist.empty()) {
      if (!SlurmMaster(slurm_nodelist, command, &s.master_addr, err)) return false;
    }
  }
  *out = s;
  return true;
}

}  // namespace dflash

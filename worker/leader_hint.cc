#include "worker/leader_hint.h"

#include <cstdio>

#include "cachelock/holder_tree.h"
#include "cachelock/status.h"

namespace dflash {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

std::string IdleLeaderHint::Tick(CompileGate& gate) {
  OwnerRecord h;
  if (window_.count() <= 0 || !gate.CurrentHolder(&h) || h.host != gate.Self().host) return "";
  std::string token = HolderToken(h);
  // A holder with no marked process runs no payload yet: it is not blocked on peers, it is waiting
  // for something else -- another node's cluster lease (which has its own hint, relayed from the
  // remote leader's renewals). The window starts over when its payload appears.
  const std::vector<pid_t> tree = HolderTreePids(token);  // one walk of /proc's environments a tick
  if (tree.empty()) {
    token_.clear();
    return "";
  }
  double cpu = HolderTreeCpuSeconds(tree);
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  if (token != token_) {
    token_ = token;
    since_ = now;
    cpu0_ = cpu;
    return "";
  }
  double window_s = std::chrono::duration<double>(now - since_).count();
  if (now - since_ < window_) return "";
  double used = cpu - cpu0_;
  since_ = now;
  cpu0_ = cpu;
  if (!HolderTreeLooksIdle(used, window_s)) return "";
  return "gate " + key_ + ": the leader " + DescribeOwner(h, h.host) + " has used " + Num(used) +
         " s of CPU in the last " + FormatSeconds(window_s) +
         ": it is not compiling, it is blocked. If the role's processes form a process group (DDP/FSDP, "
         "init_process_group), the leader waits for peers that wait here: use gate mode \"warmup\" (the default "
         "for roles of several processes) -- see docs/cachelock.md";
}

}  // namespace dflash

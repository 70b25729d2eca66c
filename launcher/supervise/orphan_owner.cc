#include "launcher/supervise/orphan_owner.h"

#include <cstdlib>

namespace dflash {

OrphanVerdict JudgeOrphan(const Orphan& o, const std::vector<RunProcess>& processes, const std::string& run_token,
                          pid_t own_group, bool run_ending) {
  OrphanVerdict v;
  auto find = [&](auto matches) {
    for (size_t i = 0; i < processes.size(); ++i)
      if (matches(processes[i])) return static_cast<int>(i);
    return -1;
  };
  if (o.pid > 0 && find([&](const RunProcess& p) { return p.pid == o.pid; }) >= 0) return v;  // one of ours
  bool same_attempt = true;
  if (o.run_token && *o.run_token == run_token && o.process) {
    v.owner = find([&](const RunProcess& p) { return p.name == *o.process; });
    if (v.owner >= 0 && o.attempt)
      same_attempt = std::atoi(o.attempt->c_str()) == processes[static_cast<size_t>(v.owner)].attempt;
  }
  // Its environment may be gone (env -i) or another run's: the session it was started in still names it.
  if (v.owner < 0 && o.sid > 0) v.owner = find([&](const RunProcess& p) { return p.pid == o.sid; });
  const RunProcess* owner = v.owner >= 0 ? &processes[static_cast<size_t>(v.owner)] : nullptr;
  bool owner_alive = owner && owner->alive && same_attempt;
  if (owner_alive && !run_ending) return v;  // a live process's child: its own business
  v.kill = true;
  v.kill_group = o.pgid > 1 && o.pgid != own_group;
  v.whose = !owner        ? "an unknown process"
            : owner_alive ? owner->name + " (the run is ending)"
                          : owner->name + (owner->alive ? " (an earlier attempt)" : " (ended)");
  return v;
}

}  // namespace dflash

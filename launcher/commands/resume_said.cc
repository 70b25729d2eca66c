#include "launcher/commands/resume_said.h"

#include <filesystem>
#include <set>
#include <tuple>

#include "launcher/metrics/spool_count.h"

namespace dflash {

namespace {

/// (step, k) of a committed checkpoint's name, or false.
bool StepOfName(const std::string& name, int64_t* step, int64_t* k) {
  constexpr size_t kDigits = 10;
  if (name.rfind("step-", 0) != 0 || name.size() < 5 + kDigits) return false;
  const std::string digits = name.substr(5, kDigits), rest = name.substr(5 + kDigits);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *k = 0;
  if (!rest.empty()) {
    if (rest[0] != '.' || rest.size() < 2 || rest.size() > 10 ||
        rest.find_first_not_of("0123456789", 1) != std::string::npos)
      return false;
    *k = std::stoll(rest.substr(1));
  }
  *step = std::stoll(digits);
  return true;
}

}  // namespace

CheckpointFound NewestCheckpoint(const std::string& dir) {
  CheckpointFound found;
  std::error_code ec;
  std::tuple<int64_t, int64_t> best{-1, -1};
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step, k;
    if (!StepOfName(it->path().filename().string(), &step, &k) || !it->is_directory(ec)) continue;
    if (std::tuple{step, k} > best) {
      best = {step, k};
      found = {it->path().string(), step};
    }
  }
  return found;
}

std::vector<std::string> ResumeSaid(const Plan& plan) {
  std::vector<std::string> out;
  if (!plan.resumed) return out;
  out.push_back("resuming run " + plan.run_id + " (attempts from attempt_" + std::to_string(plan.attempt_base) +
                ")");
  auto said = [](const std::string& who, const CheckpointFound& c) {
    return who + ": checkpoint " + c.path + " (step " + std::to_string(c.step) + ")";
  };
  std::set<std::string> roles;
  for (const ProcessPlan& p : plan.processes) {
    if (!roles.insert(p.role).second) continue;
    const std::string dir = plan.CheckpointDir(p);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) continue;  // a role that never checkpointed: nothing to say
    if (CheckpointFound c = NewestCheckpoint(dir); c.step >= 0) {
      out.push_back(said(p.role, c));
      continue;
    }
    bool any = false;  // processes outside a world checkpoint apart: <dir>/<process>/
    for (const ProcessPlan& q : plan.processes) {
      if (q.role != p.role) continue;
      if (CheckpointFound c = NewestCheckpoint(dir + "/" + q.name); c.step >= 0) {
        out.push_back(said(q.name, c));
        any = true;
      }
    }
    if (!any) out.push_back(p.role + ": no committed checkpoint in " + dir + ": it starts at step 0");
  }
  SpoolCounts n = CountSpool(plan.SpoolDir());
  if (n.present)
    out.push_back("spool " + plan.SpoolDir() + ": " + std::to_string(n.pending) + " frames pending a checkpoint " +
                  "(the restore commits those it covers, replays the rest), " + std::to_string(n.done) + " done, " +
                  std::to_string(n.ready + n.claimed) + " not yet trained on");
  return out;
}

}  // namespace dflash

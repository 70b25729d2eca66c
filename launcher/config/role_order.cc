#include "launcher/config/role_order.h"

#include <algorithm>
#include <map>

#include "launcher/config/schema.h"

namespace dflash {
namespace {

std::vector<std::string_view> RoleNames(const std::vector<RoleSpec>& roles) {
  std::vector<std::string_view> names;
  for (const RoleSpec& r : roles) names.push_back(r.name);
  return names;
}

}  // namespace

void ResolveRoleOrder(std::vector<RoleSpec>* roles_in, std::vector<ConfigError>* errors) {
  std::vector<RoleSpec>& roles = *roles_in;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < roles.size(); ++i) index.emplace(roles[i].name, i);
  bool ok = true;
  for (size_t i = 0; i < roles.size(); ++i) {
    RoleSpec& r = roles[i];
    r.starts_after.clear();
    r.phase = 0;
    std::string key = "role[" + r.name + "].after";
    for (size_t k = 0; k < r.after.size(); ++k) {
      const std::string& dep = r.after[k];
      SourcePos pos = k < r.after_pos.size() ? r.after_pos[k] : r.pos;
      auto it = index.find(dep);
      if (it == index.end()) {
        std::string near = ClosestName(dep, RoleNames(roles));
        errors->push_back({pos, key, "no role named \"" + dep + "\"", "the name of another [[role]]",
                           "\"" + dep + "\"", near.empty() ? "roles are matched by their name" : "did you mean \"" + near + "\"?"});
        ok = false;
        continue;
      }
      if (it->second == i) {
        errors->push_back({pos, key, "a role cannot start after itself", "the name of another [[role]]",
                           "\"" + dep + "\"", "remove it: the processes of one role start together"});
        ok = false;
        continue;
      }
      if (r.service && !roles[it->second].service) {
        errors->push_back({pos, key, "a service cannot start after a role that is not one",
                           "the name of another service (service = true)", "\"" + dep + "\" (not a service)",
                           "services start before every other role and stop after them: drop service = true from \"" +
                               r.name + "\", or make \"" + dep + "\" a service"});
        ok = false;
        continue;
      }
      if (std::find(r.starts_after.begin(), r.starts_after.end(), it->second) == r.starts_after.end())
        r.starts_after.push_back(it->second);
    }
    if (r.service && r.ready.mode == ReadyMode::kExit)
      errors->push_back({r.service_pos, "role[" + r.name + "].service", "a service cannot be ready by exiting",
                         "ready = \"none\", \"notify\", \"log\", \"file\" (or a network probe)", "ready = \"exit\"",
                         "a service runs until the run ends: drop service = true for a job that runs once"});
    if (!r.service)
      for (size_t j = 0; j < roles.size(); ++j)
        if (roles[j].service && std::find(r.starts_after.begin(), r.starts_after.end(), j) == r.starts_after.end())
          r.starts_after.push_back(j);
  }
  if (!ok) return;
  // Depth-first: a role met again while it is on the path closes a cycle.
  enum Mark { kNew, kOnPath, kDone };
  std::vector<Mark> mark(roles.size(), kNew);
  std::vector<size_t> path;
  bool cycle = false;
  auto visit = [&](auto&& self, size_t i) -> void {
    if (cycle) return;
    mark[i] = kOnPath;
    path.push_back(i);
    int phase = 0;
    for (size_t d : roles[i].starts_after) {
      if (mark[d] == kOnPath) {
        std::string loop;
        auto from = std::find(path.begin(), path.end(), d);
        for (auto it = from; it != path.end(); ++it) loop += roles[*it].name + " -> ";
        loop += roles[d].name;
        RoleSpec& r = roles[i];
        auto named = std::find(r.after.begin(), r.after.end(), roles[d].name);
        SourcePos pos = named != r.after.end() && static_cast<size_t>(named - r.after.begin()) < r.after_pos.size()
                            ? r.after_pos[static_cast<size_t>(named - r.after.begin())]
                            : r.pos;
        errors->push_back({pos, "role[" + r.name + "].after", "the roles' start order has a cycle: " + loop,
                           "roles that start after one another without a loop", "\"" + roles[d].name + "\"",
                           "remove one `after` of the loop (a role can only start once the others are ready)"});
        cycle = true;
        return;
      }
      if (mark[d] == kNew) self(self, d);
      if (cycle) return;
      phase = std::max(phase, roles[d].phase + 1);
    }
    roles[i].phase = phase;
    mark[i] = kDone;
    path.pop_back();
  };
  for (size_t i = 0; i < roles.size() && !cycle; ++i)
    if (mark[i] == kNew) visit(visit, i);
}

std::string DescribeStartOrder(const std::vector<RoleSpec>& roles) {
  int last = 0;
  for (const RoleSpec& r : roles) last = std::max(last, r.phase);
  std::string out;
  for (int ph = 0; ph <= last; ++ph) {
    std::string group;
    for (const RoleSpec& r : roles)
      if (r.phase == ph) group += (group.empty() ? "" : " + ") + r.name;
    if (group.empty()) continue;
    out += (out.empty() ? "" : ", then ") + group;
  }
  return out;
}

}  // namespace dflash

#include "launcher/config/spool_check.h"

#include <string>

namespace dflash {
namespace {

bool ConsumesFrames(const RoleSpec& r) { return r.spool == "consume" || r.builtin == "drafter"; }

/// The nodes `consumer` runs on that no producer runs on; empty when every one has a producer, or when the
/// node count is not known yet (`nnodes` from the flags or the scheduler) and some producer runs everywhere.
std::vector<int> NodesWithoutProducer(const RunConfig& cfg, const RoleSpec& consumer) {
  std::vector<int> nodes = consumer.nodes;
  if (nodes.empty() && cfg.run.nnodes > 0) {
    for (int n = 0; n < cfg.run.nnodes; ++n) nodes.push_back(n);
  } else if (nodes.empty()) {
    for (const RoleSpec& p : cfg.roles)
      if (p.ProducesFrames() && p.nodes.empty()) return {};
    nodes.push_back(0);  // one node unless the flags say more; the plan of a node sees the rest
  }
  std::vector<int> bare;
  for (int n : nodes) {
    bool fed = false;
    for (const RoleSpec& p : cfg.roles) fed |= p.ProducesFrames() && p.RunsOnNode(n);
    if (!fed) bare.push_back(n);
  }
  return bare;
}

}  // namespace

void CheckSpoolProducers(const RunConfig& cfg, std::vector<ConfigError>* errors) {
  bool any_producer = false;
  for (const RoleSpec& p : cfg.roles) any_producer |= p.ProducesFrames();
  for (const RoleSpec& r : cfg.roles) {
    if (!ConsumesFrames(r)) continue;
    std::string how = r.spool == "consume" ? "spool = \"consume\"" : "builtin = \"drafter\"";
    std::string key = "role[" + r.name + "]." + (r.spool == "consume" ? "spool" : "builtin");
    const char* fix =
        "give the role that publishes the frames spool = \"produce\" (a Python target: dflash_launch.roles.hf_target or "
        "dflash_launch.spool.SpoolProducer; a builtin target produces by itself): the consumers' sources end when "
        "every producer has finished. Without one they wait for frames that never come";
    if (!any_producer) {
      errors->push_back({r.spool_pos, key, "nothing produces the frames this role consumes",
                         "a role with spool = \"produce\" (or builtin = \"target\")", how + " and no producer", fix});
      continue;
    }
    std::vector<int> bare = NodesWithoutProducer(cfg, r);
    if (bare.empty()) continue;
    std::string list;
    for (int n : bare) list += (list.empty() ? "" : ", ") + std::to_string(n);
    errors->push_back({r.spool_pos, key,
                       "no producer runs on node" + std::string(bare.size() > 1 ? "s " : " ") + list +
                           ", where this role consumes frames (the spool is one host's)",
                       "a role with spool = \"produce\" on every node this role runs on",
                       "producers only on other nodes",
                       "run a producer role on those nodes too (drop its nodes list), or this role only where one "
                       "runs (its nodes list)"});
  }
}

}  // namespace dflash

// An attempt's gate facts (contract/gate_facts.h) as JSON: summary.json's "gate" and the
// "gate" of an events.jsonl line. Written straight from the typed facts, for either
// kind of nlohmann json (summary.json is ordered, events are not).
#pragma once

#include <nlohmann/json.hpp>

#include "contract/gate_facts.h"

namespace dflash {

/// The facts reported so far, each by its name (the X_DFLASH_GATE_* key, lower-cased), in
/// alphabetical order: the order summary.json has always had. An empty GateFacts gives null.
template <class Json>
Json GateFactsJson(const GateFacts& g) {
  if (g.empty()) return Json();
  Json j = Json::object();
  if (g.cluster) j["cluster"] = ClusterOutcomeName(*g.cluster);
  if (g.cluster_token) j["cluster_token"] = *g.cluster_token;
  if (g.compile_s) j["compile_s"] = *g.compile_s;
  if (g.fetch_bytes) j["fetch_bytes"] = *g.fetch_bytes;
  if (g.fetch_s) j["fetch_s"] = *g.fetch_s;
  if (g.key) j["key"] = *g.key;
  if (g.warmup_mode) j["mode"] = "warmup";
  if (g.published_bytes) j["published_bytes"] = *g.published_bytes;
  if (g.role) j["role"] = GateRoleName(*g.role);
  if (g.state) j["state"] = GateStateName(*g.state);
  if (g.wait_s) j["wait_s"] = *g.wait_s;
  return j;
}

}  // namespace dflash

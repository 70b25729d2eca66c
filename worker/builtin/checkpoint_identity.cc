#include "worker/builtin/checkpoint_identity.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "contract/env_vars.h"

namespace dflash::builtin {
namespace {

constexpr const char* kModelVars[] = {env::kHiddenShape, env::kTappedLayers, env::kTargetLayers, env::kHidden,
                                      env::kDraftLayers, env::kBlockSize,    env::kSeqLen,       env::kBatch,
                                      env::kDtype,       env::kVocab,        env::kSeed,         env::kHeads,
                                      env::kKvHeads};
constexpr const char* kKeys[] = {"run_id", "role", "process", "world_size", "model", "spool"};

std::string EnvOr(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

std::string Quoted(const std::string& s) { return s.empty() ? "\"\"" : s; }

/// "DFLASH_HIDDEN=32 here, 64 in it; ...": the [model] variables that differ.
std::string ModelDiff(const std::map<std::string, std::string>& mine, const std::map<std::string, std::string>& theirs) {
  std::string out;
  auto add = [&](const std::string& k) {
    auto a = mine.find(k), b = theirs.find(k);
    const std::string here = a == mine.end() ? "unset" : Quoted(a->second);
    const std::string there = b == theirs.end() ? "unset" : Quoted(b->second);
    if (here != there) out += (out.empty() ? "" : ", ") + k + " " + there + " in it, " + here + " here";
  };
  for (const auto& [k, v] : mine) add(k);
  for (const auto& [k, v] : theirs)
    if (!mine.count(k)) add(k);
  return out;
}

}  // namespace

CheckpointIdentity CheckpointIdentity::FromEnv(const std::string& spool) {
  CheckpointIdentity id;
  id.run_id = EnvOr(env::kRunId);
  id.role = EnvOr(env::kRoleName);
  id.process = EnvOr(env::kProcess);
  for (const char* k : kModelVars)
    if (const char* v = std::getenv(k)) id.model[k] = v;
  id.spool = spool;
  return id;
}

void CheckpointIdentity::AddTo(std::map<std::string, std::string>* meta) const {
  (*meta)["run_id"] = run_id;
  (*meta)["role"] = role;
  (*meta)["process"] = process;
  (*meta)["world_size"] = std::to_string(world_size);
  (*meta)["model"] = nlohmann::json(model).dump(-1, ' ', /*ensure_ascii=*/true);
  (*meta)["spool"] = spool;
}

CheckpointIdentity::Read CheckpointIdentity::From(const std::map<std::string, std::string>& meta,
                                                  CheckpointIdentity* out, std::string* err) {
  int present = 0;
  for (const char* k : kKeys) present += meta.count(k) ? 1 : 0;
  if (present == 0) return Read::kAbsent;
  std::string missing;
  for (const char* k : kKeys)
    if (!meta.count(k)) missing += std::string(missing.empty() ? "" : ", ") + k;
  if (!missing.empty()) {
    *err = "its identity lacks " + missing;
    return Read::kMalformed;
  }
  CheckpointIdentity id;
  id.run_id = meta.at("run_id");
  id.role = meta.at("role");
  id.process = meta.at("process");
  id.spool = meta.at("spool");
  const std::string& ws = meta.at("world_size");
  char* end = nullptr;
  id.world_size = std::strtoll(ws.c_str(), &end, 10);
  nlohmann::json m = nlohmann::json::parse(meta.at("model"), nullptr, false);
  bool model_ok = m.is_object();
  if (model_ok)
    for (const auto& [k, v] : m.items()) {
      if (!v.is_string()) {
        model_ok = false;
        break;
      }
      id.model[k] = v.get<std::string>();
    }
  if (ws.empty() || *end || id.world_size < 1 || !model_ok) {
    *err = "its identity's world_size (\"" + ws + "\") or model (" + meta.at("model") + ") cannot be read";
    return Read::kMalformed;
  }
  *out = std::move(id);
  return Read::kOk;
}

IdentityCheck JudgeIdentity(const CheckpointIdentity& mine, const CheckpointIdentity* theirs, bool adopt,
                            const std::string& path) {
  IdentityCheck c;
  const std::string on_purpose = "to start from its state on purpose: DFLASH_CHECKPOINT_ADOPT=1 in the role's env";
  const std::string elsewhere = "or give this run another [run] checkpoint_dir";
  if (!theirs) {
    if (adopt) {
      c.verdict = IdentityCheck::kAdopt;
      c.why = "adopting " + path + " (no run identity: written before checkpoints recorded one; "
              "DFLASH_CHECKPOINT_ADOPT=1)";
      return c;
    }
    c.why = "checkpoint " + path + " has no run identity (written before dflash-launch recorded one): it may be "
            "another run's, and a fresh run never resumes another run's checkpoint. To continue the run that wrote "
            "it: dflash-launch run --resume --run-id <its run id> with DFLASH_CHECKPOINT_ADOPT=1; " + on_purpose +
            "; " + elsewhere;
    return c;
  }
  if (std::string diff = ModelDiff(mine.model, theirs->model); !diff.empty()) {
    c.why = "checkpoint " + path + " was written for another [model] (" + diff + "): its tensors are not this "
            "drafter's; fix: the [model] of the run that wrote it (run " + Quoted(theirs->run_id) + "), or " +
            "another [run] checkpoint_dir";
    return c;
  }
  if (theirs->world_size != mine.world_size) {
    c.why = "checkpoint " + path + " was written by a world of " + std::to_string(theirs->world_size) +
            " ranks, this is one of " + std::to_string(mine.world_size) + "; fix: another [run] checkpoint_dir";
    return c;
  }
  const bool same_run = theirs->run_id == mine.run_id && theirs->role == mine.role;
  c.same_spool = theirs->spool == mine.spool;
  if (same_run && c.same_spool) {
    c.verdict = IdentityCheck::kSameRun;
    return c;
  }
  if (adopt) {
    c.verdict = IdentityCheck::kAdopt;
    c.why = "adopting " + path + " of run " + Quoted(theirs->run_id) + " (role " + Quoted(theirs->role) +
            ", DFLASH_CHECKPOINT_ADOPT=1): its weights, optimizer and step" +
            (c.same_spool ? ", and its place in this spool" : "; this spool's frames from its start");
    return c;
  }
  if (theirs->run_id != mine.run_id) {
    c.why = "checkpoint " + path + " belongs to run " + Quoted(theirs->run_id) + " (role " + Quoted(theirs->role) +
            "), not to this run " + Quoted(mine.run_id) + ": a fresh run never resumes another run's checkpoint. " +
            "To continue that run: dflash-launch run --resume --run-id " + Quoted(theirs->run_id) + "; " +
            on_purpose + "; " + elsewhere;
  } else if (theirs->role != mine.role) {
    c.why = "checkpoint " + path + " is role " + Quoted(theirs->role) + "'s, this process is role " +
            Quoted(mine.role) + "'s; " + on_purpose + "; " + elsewhere;
  } else {
    c.why = "checkpoint " + path + " consumed spool " + theirs->spool + ", this run reads " + mine.spool +
            " (was [run] spool_dir changed?): its place in a spool means nothing in another; fix: the spool_dir it "
            "was written with, or " + on_purpose + " (this spool's frames from its start)";
  }
  return c;
}

}  // namespace dflash::builtin

// What the builtin roles share (roles.cc: the drafter and the tools; target_role.cc: the
// target): the [model] contract and the process's name from the environment, its output
// lines, its metrics file, and one sample as the target makes it. Not part of the API.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/builtin/model.h"
#include "worker/builtin/roles.h"
#include "spool/safetensors.h"

namespace dflash::builtin {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double Since(Clock::time_point t0);
double Round(double x, int digits);
std::string Env(const char* k, const std::string& fallback = "");

/// One line on stdout, prefixed with the process name, flushed (the
/// supervisor's log router reads whole lines).
void Say(const std::string& name, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Complain(const std::string& name, const std::string& what);

struct Role {
  ModelEnv m;
  std::string name;
  int64_t rank = 0;
};

/// The [model] contract from the environment, the process name and rank.
bool Setup(const BuiltinOptions& o, const std::string& role, Role* r);
bool SpoolRoot(const Role& r, std::string* root);
void WriteMetrics(const std::string& name, const json& j);

/// Sample `seq` of target `rank`: token ids [B, S] and the concatenated taps.
std::pair<at::Tensor, at::Tensor> MakeSample(const TargetModel& t, const TokenChain& chain, const ModelEnv& m,
                                             int64_t rank, int64_t seq);
std::vector<safetensors::TensorRef> FrameRefs(const at::Tensor& hidden, const at::Tensor& tokens);
std::string ManifestPath(const std::string& root);

/// A warm-up (DFLASH_WARMUP=1: gate mode "warmup", `dflash-launch seed`) stays
/// off the spool: a real frame it took would be trained on by a process whose
/// steps are thrown away, and a frame it published would count for no producer.
bool InWarmup();

}  // namespace dflash::builtin

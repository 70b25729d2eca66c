// The builtin target (docs/builtin.md): publishes the taps of its samples as
// frames into the spool, and the shared embedding and LM head once.
#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/exit_codes.h"
#include "common/notify.h"
#include "contract/env_vars.h"
#include "contract/spool_layout.h"
#include "spool/frame_contract.h"
#include "worker/builtin/model.h"
#include "worker/builtin/roles_internal.h"
#include "spool/spool.h"

namespace dflash::builtin {
namespace {

/// The target's warm-up: one forward of its first sample, checked against the
/// contract and discarded; then READY and exit 0.
int WarmUpTarget(const Role& r) {
  TargetModel model(r.m);
  TokenChain chain(r.m.seed, r.m.frame.vocab);
  auto [tokens, taps] = MakeSample(model, chain, r.m, r.rank, 0);
  ContractViolation v;
  if (!CheckHiddenShape(r.m.frame.shape, taps.sizes().vec(), &v)) {
    Complain(r.name, "refusing to publish: " + v.message + "; expected " + v.expected + ", found " + v.found);
    return exit_code::kFrameContract;
  }
  std::string err;
  NotifySend("READY=1\nSTATUS=warm-up: one forward, nothing published", &err);
  Say(r.name, "warm-up: one forward, nothing published (the role's processes publish the frames)");
  return exit_code::kOk;
}

/// DFlash shares the target's embedding and LM head with the drafter: one
/// copy for the whole spool (replicas are identical: the first one wins, `won`).
bool PublishSharedWeights(const Role& r, const TargetModel& model, spool::SpoolProducer* producer, bool* won,
                          std::string* err) {
  at::Tensor embed = model.Param("embed.weight").to(at::kFloat).contiguous();
  at::Tensor head = model.Param("lm_head.weight").to(at::kFloat).contiguous();
  safetensors::Metadata wmeta = {{"format", std::string(spool::layout::kWeightsFormat)},
                                 {"producer", r.name},
                                 {"seed", std::to_string(r.m.seed)},
                                 {"vocab", std::to_string(r.m.frame.vocab)},
                                 {"hidden", std::to_string(r.m.hidden)}};
  return producer->PublishShared(std::string(spool::layout::kWeightsFile), wmeta,
                                 {{"embed.weight", "F32", embed.sizes().vec(), embed.data_ptr(), embed.nbytes()},
                                  {"lm_head.weight", "F32", head.sizes().vec(), head.data_ptr(), head.nbytes()}},
                                 won, err);
}

}  // namespace

int RunTarget(const BuiltinOptions& o) {
  Role r;
  std::string root, err;
  if (!Setup(o, "target", &r)) return exit_code::kUsage;
  if (InWarmup()) return WarmUpTarget(r);
  if (!SpoolRoot(r, &root)) return exit_code::kUsage;
  const FrameContract& fc = r.m.frame;
  auto t_start = Clock::now();
  // The byte budget: [run] spool_max_bytes through the launcher, else half the spool's free space (spool.h).
  int64_t max_bytes = 0;
  if (std::string b = Env(env::kSpoolMaxBytes); !b.empty()) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(b.c_str(), &end, 10);
    if (errno || *end || v <= 0) {
      Complain(r.name, std::string(env::kSpoolMaxBytes) + "=" + b + " is not a positive byte count ([run] "
               "spool_max_bytes)");
      return exit_code::kUsage;
    }
    max_bytes = v;
  }
  spool::SpoolProducer producer(root, r.name, o.spool_max, max_bytes);
  if (!producer.Open(&err)) {
    Complain(r.name, err);
    return exit_code::kFailure;
  }
  const int producers = std::atoi(Env(env::kSpoolProducers, "0").c_str());
  bool manifest = false;
  if (producer.finished()) {
    Say(r.name, "already finished (%lld frames): nothing left to publish", static_cast<long long>(producer.next_seq()));
    if (!spool::WriteManifestIfFinal(root, producers, ManifestPath(root), &manifest, &err)) Complain(r.name, err);
    return exit_code::kOk;
  }
  const int64_t resumed_at = producer.next_seq();
  TargetModel model(r.m);
  TokenChain chain(r.m.seed, fc.vocab);

  bool won = false;
  if (!PublishSharedWeights(r, model, &producer, &won, &err)) {
    Complain(r.name, err);
    return exit_code::kFailure;
  }
  Say(r.name, "%s frames %lld..%lld into %s: taps [%s] of %lld layers, %s %s%s", resumed_at ? "resuming:" : "publishing",
      static_cast<long long>(resumed_at), static_cast<long long>(o.samples - 1), root.c_str(),
      fc.TapsString().c_str(), static_cast<long long>(fc.target_layers), ShapeString(fc.shape.Shape()).c_str(),
      fc.dtype.c_str(), won ? "; published weights.safetensors" : "");
  if (producer.removed_tmp()) Say(r.name, "removed %d half-written frame(s) of an earlier attempt", producer.removed_tmp());

  double forward_s = 0;
  int64_t published = 0;
  while (producer.next_seq() < o.samples) {
    const int64_t seq = producer.next_seq();
    auto t0 = Clock::now();
    auto [tokens, taps] = MakeSample(model, chain, r.m, r.rank, seq);
    forward_s += Since(t0);
    // The contract at the producer's end too: publish only what [model] promises.
    ContractViolation v;
    if (!CheckHiddenShape(fc.shape, taps.sizes().vec(), &v)) {
      Complain(r.name, "refusing to publish: " + v.message + "; expected " + v.expected + ", found " + v.found);
      return exit_code::kFrameContract;
    }
    if (!producer.Publish(FrameMetadata(fc), FrameRefs(taps, tokens), nullptr, &err)) {
      Complain(r.name, err);
      return exit_code::kFailure;
    }
    ++published;
    if ((seq + 1) % 100 == 0)
      Say(r.name, "%lld/%lld frames (%.0f frames/s; waited %.1fs for the drafters)", static_cast<long long>(seq + 1),
          static_cast<long long>(o.samples), published / std::max(1e-9, Since(t_start)), producer.waited_s());
  }
  if (!producer.Finish(&err)) {
    Complain(r.name, err);
    return exit_code::kFailure;
  }
  // The drafters may have acknowledged our last frame before the marker was
  // there: then the spool becomes final now, and we write its manifest.
  if (!spool::WriteManifestIfFinal(root, producers, ManifestPath(root), &manifest, &err)) Complain(r.name, err);
  double wall = Since(t_start);
  json m = {{"process", r.name},
            {"role", "target"},
            {"impl", "builtin"},
            {"torch_version", DFLASH_LIBTORCH_VERSION},
            {"frames", published},
            {"next_seq", producer.next_seq()},
            {"resumed_at", resumed_at},
            {"removed_tmp", producer.removed_tmp()},
            {"weights_published", won},
            {"manifest_written", manifest},
            {"forward_s", Round(forward_s, 3)},
            {"backpressure_wait_s", Round(producer.waited_s(), 3)},
            {"wall_s", Round(wall, 3)},
            {"frames_per_s", Round(published / std::max(1e-9, wall), 1)}};
  WriteMetrics(r.name, m);
  Say(r.name, "done: %lld frames published (%.1f ms forward each, waited %.1fs for the drafters)",
      static_cast<long long>(producer.next_seq()), 1000 * forward_s / std::max<int64_t>(1, published),
      producer.waited_s());
  return exit_code::kOk;
}

}  // namespace dflash::builtin

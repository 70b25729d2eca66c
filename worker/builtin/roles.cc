#include "worker/builtin/roles.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <thread>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "contract/process_env.h"
#include "worker/builtin/frame_contract.h"
#include "worker/builtin/model.h"
#include "worker/builtin/spool.h"

namespace dflash::builtin {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Round(double x, int digits) {
  double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

std::string Env(const char* k, const std::string& fallback = "") {
  const char* v = std::getenv(k);
  return v && *v ? v : fallback;
}

/// One line on stdout, prefixed with the process name, flushed (the
/// supervisor's log router reads whole lines).
void Say(const std::string& name, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Say(const std::string& name, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stdout, "%s: %s\n", name.c_str(), buf);
  std::fflush(stdout);
}

void Complain(const std::string& name, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", name.c_str(), what.c_str());
  std::fflush(stderr);
}

struct Role {
  ModelEnv m;
  std::string name;
  int64_t rank = 0;
};

/// The [model] contract from the environment, the process name and rank.
bool Setup(const BuiltinOptions& o, const std::string& role, Role* r) {
  std::string err;
  r->rank = std::atoll(Env(env::kRoleRank, "0").c_str());
  r->name = Env(env::kProcess, role + ":" + std::to_string(r->rank));
  if (!ModelFromEnv(&r->m, &err)) {
    Complain("dflash-builtin " + role, err);
    return false;
  }
  at::set_num_threads(std::max(1, o.threads));
  return true;
}

bool SpoolRoot(const Role& r, std::string* root) {
  *root = Env(env::kSpoolDir);
  if (root->empty())
    Complain(r.name, std::string(env::kSpoolDir) + " is not set: the spool directory frames go through (dflash-launch sets it "
                     "to <[run] spool_dir>/<run_id>)");
  return !root->empty();
}

void WriteMetrics(const std::string& name, const json& j) {
  std::string path = Env(env::kMetricsFile), err;
  if (path.empty()) return;
  if (!WriteFileAtomic(path, j.dump(2) + "\n", &err, 0600)) Complain(name, "cannot write metrics: " + err);
}

/// Sample `seq` of target `rank`: token ids [B, S] and the concatenated taps.
/// (A forward of [8B, S] costs as much per sample as one of [B, S] here: the
/// target is compute-bound even at this size, so there is no micro-batching.)
std::pair<at::Tensor, at::Tensor> MakeSample(const TargetModel& t, const TokenChain& chain, const ModelEnv& m,
                                             int64_t rank, int64_t seq) {
  const int64_t B = m.frame.shape.batch, S = m.frame.shape.seq_len;
  at::Tensor tokens = at::empty({B, S}, at::kLong);
  for (int64_t b = 0; b < B; ++b) chain.Sample(rank, seq * B + b, tokens.data_ptr<int64_t>() + b * S, S);
  return {tokens, t.Taps(tokens)};
}

std::vector<safetensors::TensorRef> FrameRefs(const at::Tensor& hidden, const at::Tensor& tokens) {
  return {{"hidden", DTypeName(hidden), hidden.sizes().vec(), hidden.data_ptr(), hidden.nbytes()},
          {"tokens", "I64", tokens.sizes().vec(), tokens.data_ptr(), tokens.nbytes()}};
}

std::string ManifestPath(const std::string& root) {
  std::string run_dir = Env(env::kRunDir);
  return run_dir.empty() ? root + "/spool.json" : run_dir + "/spool.json";
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// A warm-up (DFLASH_WARMUP=1: gate mode "warmup", `dflash-launch seed`) stays
/// off the spool: a real frame it took would be trained on by a process whose
/// steps are thrown away, and a frame it published would count for no producer.
bool InWarmup() { return Env(env::kWarmup) == "1"; }

at::ScalarType ContractScalar(const std::string& dtype) {
  return dtype == "bf16" ? at::kBFloat16 : dtype == "fp16" ? at::kHalf : at::kFloat;
}

/// The drafter's warm-up: one step on a synthetic frame of [model] (the shapes
/// and dtype of a real one; tokens of the seed's chain), with the drafter's own
/// embedding and head for the target's (a warm-up's results are never used);
/// then READY and exit 0.
int WarmUpDrafter(const BuiltinOptions& o, const Role& r) {
  auto t_start = Clock::now();
  Drafter drafter(r.m);
  const FrameContract& fc = r.m.frame;
  const int64_t B = fc.shape.batch, S = fc.shape.seq_len;
  TokenChain chain(r.m.seed, fc.vocab);
  at::Tensor tokens = at::empty({B, S}, at::kLong);
  for (int64_t b = 0; b < B; ++b) chain.Sample(r.rank, b, tokens.data_ptr<int64_t>() + b * S, S);
  at::manual_seed(r.m.seed);
  at::Tensor hidden = at::randn(fc.shape.Shape()).to(ContractScalar(fc.dtype));
  auto t0 = Clock::now();
  at::Tensor loss = drafter.Loss(hidden, tokens);
  loss.backward();
  drafter.Step(o.lr);
  const double first = Round(loss.item<double>(), 5), dt = Since(t0);
  WriteMetrics(r.name, {{"process", r.name}, {"role", "drafter"}, {"impl", "builtin"},
                        {"torch_version", DFLASH_LIBTORCH_VERSION}, {"source", "synthetic"}, {"warmup", true},
                        {"synthetic_frames", 1}, {"frames_acked", 0}, {"steps", 1}, {"first_loss", first},
                        {"first_step_s", Round(dt, 3)}, {"wall_s", Round(Since(t_start), 3)}});
  std::string err;
  NotifySend("READY=1\nSTATUS=warm-up: one step on a synthetic frame", &err);
  Say(r.name, "warm-up: one step on a synthetic frame (loss %.4f); the spool's frames are for the role's processes",
      first);
  return exit_code::kOk;
}

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

}  // namespace

// ---------------------------------------------------------------------------

int RunTarget(const BuiltinOptions& o) {
  Role r;
  std::string root, err;
  if (!Setup(o, "target", &r)) return exit_code::kUsage;
  if (InWarmup()) return WarmUpTarget(r);
  if (!SpoolRoot(r, &root)) return exit_code::kUsage;
  const FrameContract& fc = r.m.frame;
  auto t_start = Clock::now();
  spool::SpoolProducer producer(root, r.name, o.spool_max);
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

  // DFlash shares the target's embedding and LM head with the drafter: one
  // copy for the whole spool (replicas are identical: the first one wins).
  at::Tensor embed = model.Param("embed.weight").to(at::kFloat).contiguous();
  at::Tensor head = model.Param("lm_head.weight").to(at::kFloat).contiguous();
  safetensors::Metadata wmeta = {{"format", "dflash-weights/1"},
                                 {"producer", r.name},
                                 {"seed", std::to_string(r.m.seed)},
                                 {"vocab", std::to_string(fc.vocab)},
                                 {"hidden", std::to_string(r.m.hidden)}};
  bool won = false;
  if (!producer.PublishShared("weights.safetensors", wmeta,
                              {{"embed.weight", "F32", embed.sizes().vec(), embed.data_ptr(), embed.nbytes()},
                               {"lm_head.weight", "F32", head.sizes().vec(), head.data_ptr(), head.nbytes()}},
                              &won, &err)) {
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

// ---------------------------------------------------------------------------

int RunDrafter(const BuiltinOptions& o) {
  Role r;
  std::string root, err;
  if (!Setup(o, "drafter", &r)) return exit_code::kUsage;
  if (InWarmup()) return WarmUpDrafter(o, r);
  if (!SpoolRoot(r, &root)) return exit_code::kUsage;
  const int producers = std::atoi(Env(env::kSpoolProducers, "0").c_str());
  auto t_start = Clock::now();
  Drafter drafter(r.m);

  // The target's embedding and LM head, frozen.
  spool::SpoolPaths paths{root};
  spool::Backoff backoff(50'000);
  for (auto t0 = Clock::now(), next_say = t0 + std::chrono::seconds(5); !Exists(paths.Weights());) {
    if (Clock::now() >= next_say) {
      Say(r.name, "waiting for %s from the targets (%.0fs)", paths.Weights().c_str(), Since(t0));
      next_say += std::chrono::seconds(60);
    }
    backoff.Sleep();
  }
  safetensors::File weights;
  if (!weights.Read(paths.Weights(), &err)) {
    Complain(r.name, err);
    return exit_code::kFailure;
  }
  if (!drafter.Load(weights, {"embed.weight", "lm_head.weight"}, &err)) {
    auto it = weights.header().metadata.find("producer");
    Complain(r.name, "the shared weights " + paths.Weights() + " from producer " +
                         (it == weights.header().metadata.end() ? "(unnamed)" : it->second) +
                         " do not match [model]: " + err + "; fix: publish the embedding and LM head of the target "
                         "[model] describes (vocab x hidden)");
    return exit_code::kFrameContract;
  }

  spool::SpoolConsumer consumer(root, r.name, producers);
  if (!consumer.Open(&err)) {
    Complain(r.name, err);
    return exit_code::kFailure;
  }
  std::vector<double> losses;
  double step_s = 0, first_step_s = 0;
  bool manifest = false;
  json m = {{"process", r.name}, {"role", "drafter"}, {"impl", "builtin"}, {"torch_version", DFLASH_LIBTORCH_VERSION},
            {"source", "spool"}};
  auto fill = [&] {
    m["steps"] = losses.size();
    m["samples"] = static_cast<int64_t>(losses.size()) * r.m.frame.shape.batch;
    m["first_loss"] = losses.empty() ? json() : json(losses.front());
    m["last_loss"] = losses.empty() ? json() : json(losses.back());
    m["losses"] = losses;
    m["taken_back"] = consumer.taken_back();
    m["frames_acked"] = consumer.acked();
    m["spool_wait_s"] = Round(consumer.waited_s(), 3);
    m["step_s"] = Round(losses.empty() ? 0 : step_s / losses.size(), 5);
    m["first_step_s"] = Round(first_step_s, 3);
    m["wall_s"] = Round(Since(t_start), 3);
    m["manifest_written"] = manifest;
  };
  while (o.steps <= 0 || static_cast<int64_t>(losses.size()) < o.steps) {
    spool::ClaimedFrame f;
    bool end = false;
    if (!consumer.Next(&f, &end, &err)) {
      Complain(r.name, err);
      return exit_code::kFailure;
    }
    if (end) break;
    // The contract, before any compute: metadata, names, dtypes, shapes, ids.
    safetensors::File file;
    std::string violation;
    bool ok = file.Read(f.path, &err);
    if (!ok) violation = "frame " + f.file + " from producer " + f.producer + " cannot be read: " + err;
    else if (CheckFrame(r.m.frame, file.header(), f.file, &violation)) {
      const safetensors::TensorEntry& t = *file.header().Find("tokens");
      ok = CheckTokenRange(r.m.frame, reinterpret_cast<const int64_t*>(file.Data(t)),
                           static_cast<size_t>((t.end - t.begin) / 8), f.file, f.producer, &violation);
    } else {
      ok = false;
    }
    if (!ok) {
      if (!consumer.Reject(f, violation, &err)) Complain(r.name, err);
      Complain(r.name, violation + "\n(the frame is in " + paths.Rejected() + "; nothing was consumed from it)");
      fill();
      m["rejected"] = f.file;
      WriteMetrics(r.name, m);
      return exit_code::kFrameContract;
    }
    at::Tensor hidden = TensorOf(file, *file.header().Find("hidden"));
    at::Tensor tokens = TensorOf(file, *file.header().Find("tokens"));
    auto t0 = Clock::now();
    at::Tensor loss = drafter.Loss(hidden, tokens);
    loss.backward();
    drafter.Step(o.lr);
    double dt = Since(t0);
    step_s += dt;
    if (o.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.pace_ms));
    if (!consumer.Ack(f, &err)) {
      Complain(r.name, err);
      return exit_code::kFailure;
    }
    losses.push_back(Round(loss.item<double>(), 5));
    // Whoever acknowledges the last frame writes the spool's manifest.
    if (!consumer.WriteManifestIfFinal(ManifestPath(root), &manifest, &err)) Complain(r.name, err);
    const size_t step = losses.size() - 1;
    if (step == 0) {
      first_step_s = dt;
      m["time_to_first_step_s"] = Round(Since(t_start), 3);  // the run summary's "first step" (training_report.h)
      fill();
      WriteMetrics(r.name, m);
      char status[160];
      std::snprintf(status, sizeof status, "first step loss %.4f%s", losses[0],
                    f.taken_back ? " (a frame taken back from an earlier attempt)" : "");
      NotifySend(std::string("READY=1\nSTATUS=") + status, &err);
      Say(r.name, "%s; %s %s", status, r.m.frame.dtype.c_str(), ShapeString(r.m.frame.shape.Shape()).c_str());
    } else if (step % 50 == 0) {
      char status[96];
      std::snprintf(status, sizeof status, "step %zu loss %.4f", step, losses.back());
      // Under dflash-worker the STATUS line reaches the console already; alone, say it.
      if (Env(env::kNotifySocket).empty()) Say(r.name, "%s", status);
      else NotifySend(std::string("STATUS=") + status, &err);
    }
  }
  if (!manifest && !consumer.WriteManifestIfFinal(ManifestPath(root), &manifest, &err)) Complain(r.name, err);
  fill();
  WriteMetrics(r.name, m);
  if (losses.empty()) Say(r.name, "no frames to train on");
  else
    Say(r.name, "%zu steps, loss %.4f -> %.4f (%.1f ms/step; %d taken back)", losses.size(), losses.front(),
        losses.back(), 1000 * step_s / losses.size(), consumer.taken_back());
  return exit_code::kOk;
}

// ---------------------------------------------------------------------------

int ExportTarget(const BuiltinOptions& o) {
  Role r;
  std::string err;
  if (!Setup(o, "export-target", &r)) return exit_code::kUsage;
  TargetModel model(r.m);
  safetensors::Metadata meta = {{"format", "dflash-target-weights/1"},
                                {"seed", std::to_string(r.m.seed)},
                                {"heads", std::to_string(r.m.heads)},
                                {"kv_heads", std::to_string(r.m.kv_heads)}};
  if (!safetensors::WriteFile(o.out, meta, RefsOf(model.params()), &err, /*exclusive=*/false)) {
    Complain("export-target", err);
    return exit_code::kFailure;
  }
  return exit_code::kOk;
}

int InitDrafter(const BuiltinOptions& o) {
  Role r;
  std::string err;
  if (!Setup(o, "init-drafter", &r)) return exit_code::kUsage;
  Drafter d(r.m);
  if (!safetensors::WriteFile(o.out, {{"format", "dflash-drafter-weights/1"}}, RefsOf(d.params()), &err, false)) {
    Complain("init-drafter", err);
    return exit_code::kFailure;
  }
  return exit_code::kOk;
}

int Tap(const BuiltinOptions& o) {
  Role r;
  std::string err;
  if (!Setup(o, "tap", &r)) return exit_code::kUsage;
  TargetModel model(r.m);
  TokenChain chain(r.m.seed, r.m.frame.vocab);
  auto [tokens, taps] = MakeSample(model, chain, r.m, o.rank, o.seq);
  safetensors::Metadata meta = FrameMetadata(r.m.frame);
  meta["producer"] = "target:" + std::to_string(o.rank);
  meta["seq"] = std::to_string(o.seq);
  if (!safetensors::WriteFile(o.out, meta, FrameRefs(taps, tokens), &err, false)) {
    Complain("tap", err);
    return exit_code::kFailure;
  }
  return exit_code::kOk;
}

int CheckFrameFile(const BuiltinOptions& o) {
  Role r;
  std::string err, violation;
  if (!Setup(o, "check-frame", &r)) return exit_code::kUsage;
  safetensors::File f;
  if (!f.Read(o.frame, &err)) {
    Complain("check-frame", err);
    return exit_code::kFailure;
  }
  std::string name = o.frame.substr(o.frame.rfind('/') + 1);
  if (!CheckFrame(r.m.frame, f.header(), name, &violation)) {
    Complain("check-frame", violation);
    return exit_code::kFrameContract;
  }
  std::printf("%s: matches [model]\n", name.c_str());
  return exit_code::kOk;
}

int Loss(const BuiltinOptions& o) {
  Role r;
  std::string err, violation;
  if (!Setup(o, "loss", &r)) return exit_code::kUsage;
  Drafter d(r.m);
  safetensors::File w, f;
  if (!w.Read(o.weights, &err) || !d.Load(w, {}, &err) || !f.Read(o.frame, &err)) {
    Complain("loss", err);
    return exit_code::kFailure;
  }
  std::string name = o.frame.substr(o.frame.rfind('/') + 1);
  if (!CheckFrame(r.m.frame, f.header(), name, &violation)) {
    Complain("loss", violation);
    return exit_code::kFrameContract;
  }
  at::Tensor hidden = TensorOf(f, *f.header().Find("hidden"));
  at::Tensor tokens = TensorOf(f, *f.header().Find("tokens"));
  std::vector<double> losses;
  for (int64_t i = 0; i < std::max<int64_t>(1, o.steps); ++i) {
    at::Tensor loss = d.Loss(hidden, tokens);
    losses.push_back(loss.item<double>());
    loss.backward();
    d.Step(o.lr);
  }
  std::printf("%s\n", json({{"loss", losses.front()}, {"losses", losses}}).dump().c_str());
  return exit_code::kOk;
}

}  // namespace dflash::builtin

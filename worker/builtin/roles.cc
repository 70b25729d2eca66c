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
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/notify.h"
#include "contract/env_vars.h"
#include "worker/builtin/drafter_checkpoint.h"
#include "spool/frame_contract.h"
#include "spool/map_cache.h"
#include "worker/builtin/model.h"
#include "worker/builtin/roles_internal.h"
#include "spool/spool.h"
#include "spool/spool_ring.h"

namespace dflash::builtin {

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Round(double x, int digits) {
  double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

std::string Env(const char* k, const std::string& fallback) {
  const char* v = std::getenv(k);
  return v && *v ? v : fallback;
}

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

// (A forward of [8B, S] costs as much per sample as one of [B, S] here: the
// target is compute-bound even at this size, so there is no micro-batching.)
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

bool InWarmup() { return Env(env::kWarmup) == "1"; }

namespace {

/// The stop signal (SIGTERM) a checkpointing drafter got: taken after the step, or while it waits for frames.
volatile std::sig_atomic_t g_stop = 0;

void OnStop(int sig) { g_stop = sig; }

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

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

/// One drafter on the spool: waits for the target's shared weights, then trains on each frame it claims,
/// checked against the contract first, until the spool ends or `steps` are done; its metrics as it goes. With
/// checkpoints (`checkpoint_dir` not empty) it first resumes from the last one, and its acknowledged frames
/// commit with each.
class DrafterRun {
 public:
  DrafterRun(const BuiltinOptions& o, const Role& r, const std::string& root, int producers,
             const std::string& checkpoint_dir)
      : o_(o),
        r_(r),
        root_(root),
        t_start_(Clock::now()),
        drafter_(r.m),
        paths_{root},
        consumer_(root, r.name, producers) {
    if (!checkpoint_dir.empty())
      checkpoints_.emplace(
          checkpoint_dir,
          CheckpointOptions{o.checkpoint_every, o.checkpoint_keep, o.checkpoint_pause_ms, o.checkpoint_adopt},
          CheckpointIdentity::FromEnv(root));
    m_ = {{"process", r.name}, {"role", "drafter"}, {"impl", "builtin"}, {"torch_version", DFLASH_LIBTORCH_VERSION},
          {"source", "spool"}};
  }

  int Run();

 private:
  /// The target's embedding and LM head, frozen. An exit code, or kOk to go on.
  int LoadSharedWeights();
  /// One claimed frame: checked, trained on, acknowledged. An exit code, or kOk to go on.
  int TrainOn(const spool::ClaimedFrame& f);
  /// The contract, before any compute: metadata, names, dtypes, shapes, ids. False: `violation` says why.
  bool ReadCheckedFrame(const spool::ClaimedFrame& f, safetensors::File* file, std::string* violation);
  /// Drops the frame's views and its mapping before Ack truncates the file; false if a view outlives them.
  bool ReleaseFrame(const spool::ClaimedFrame& f, safetensors::File* file, at::Tensor* hidden, at::Tensor* tokens);
  /// READY after the first step (its loss, in the metrics too); a STATUS every 50 steps.
  void Report(const spool::ClaimedFrame& f, double dt);
  /// The metrics so far, into m_.
  void Fill();
  /// After a stop signal's checkpoint: says so, then ends by that signal (as without a checkpoint).
  int EndByStop();
  /// Resumes from the last checkpoint (if any). Not kOk: said why, and the exit code (78: refused).
  int Restore();
  /// A checkpoint of the steps done, if any since the last; its frames committed. False: said why.
  bool Checkpoint();

  const BuiltinOptions& o_;
  const Role& r_;
  const std::string root_;
  const Clock::time_point t_start_;
  Drafter drafter_;
  spool::SpoolPaths paths_;
  spool::SpoolConsumer consumer_;
  // The mappings of the spool ring's files, kept for the next frames written over them (map_cache.h).
  std::shared_ptr<safetensors::MapCache> maps_ = std::make_shared<safetensors::MapCache>();
  std::optional<DrafterCheckpoints> checkpoints_;
  int64_t resumed_from_ = 0;  // the step the restored checkpoint recorded (0: none)
  std::vector<double> losses_;
  double step_s_ = 0, first_step_s_ = 0;
  bool manifest_ = false;
  json m_;
};

int DrafterRun::Run() {
  std::string err;
  if (int code = LoadSharedWeights(); code != exit_code::kOk) return code;
  if (!consumer_.Open(&err)) {
    Complain(r_.name, err);
    return exit_code::kFailure;
  }
  if (checkpoints_) {
    if (int code = Restore(); code != exit_code::kOk) return code;
    // A stop (the supervisor's, `ctl stop`, a forwarded preemption) writes a checkpoint first (docs/checkpoints.md).
    struct sigaction sa {};
    sa.sa_handler = OnStop;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, nullptr);
    consumer_.StopWhen(&g_stop);
  }
  // `steps` counts across attempts: a resumed run ends where the uninterrupted one would.
  while (o_.steps <= 0 || resumed_from_ + static_cast<int64_t>(losses_.size()) < o_.steps) {
    spool::ClaimedFrame f;
    bool end = false;
    if (!consumer_.Next(&f, &end, &err)) {
      Complain(r_.name, err);
      return exit_code::kFailure;
    }
    if (end) break;
    if (int code = TrainOn(f); code != exit_code::kOk) return code;
    if (checkpoints_ && checkpoints_->Due(resumed_from_ + static_cast<int64_t>(losses_.size())) && !Checkpoint())
      return exit_code::kFailure;
    if (g_stop) break;
  }
  if (checkpoints_ && !Checkpoint()) return exit_code::kFailure;  // the last steps and their frames
  if (g_stop) return EndByStop();
  if (!manifest_ && !consumer_.WriteManifestIfFinal(ManifestPath(root_), &manifest_, &err)) Complain(r_.name, err);
  Fill();
  WriteMetrics(r_.name, m_);
  if (losses_.empty()) Say(r_.name, "no frames to train on");
  else
    Say(r_.name, "%zu steps, loss %.4f -> %.4f (%.1f ms/step; %d taken back)", losses_.size(), losses_.front(),
        losses_.back(), 1000 * step_s_ / losses_.size(), consumer_.taken_back());
  return exit_code::kOk;
}

int DrafterRun::EndByStop() {
  const int sig = g_stop;
  const char* abbrev = sigabbrev_np(sig);
  const std::string signame = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
  const std::string path = m_.contains("checkpoint") ? m_["checkpoint"]["path"].get<std::string>() : "-";
  Say(r_.name, "%s: checkpoint at step %lld committed (%s); stopping", signame.c_str(),
      static_cast<long long>(resumed_from_ + static_cast<int64_t>(losses_.size())), path.c_str());
  Fill();
  WriteMetrics(r_.name, m_);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
  return exit_code::kFailure;  // not reached: the signal's default action ends the process
}

int DrafterRun::Restore() {
  std::string err, path;
  std::vector<std::string> notes;
  auto t0 = Clock::now();
  RestoreResult r = checkpoints_->Restore(&drafter_, &consumer_, &resumed_from_, &path, &notes, &err);
  for (const std::string& n : notes) Say(r_.name, "%s", n.c_str());
  if (r != RestoreResult::kOk) {
    // Refused: a restart would find the same checkpoints and done/ (exit 78 is never restarted).
    Complain(r_.name, "cannot resume: " + err);
    return r == RestoreResult::kRefused ? exit_code::kCheckpointRefused : exit_code::kFailure;
  }
  if (path.empty()) {
    Say(r_.name, "no checkpoint in %s: starting at step 0", checkpoints_->dir().c_str());
    return exit_code::kOk;
  }
  const double took = Since(t0);
  Say(r_.name, "resumed from step %lld (%s, %.2fs)", static_cast<long long>(resumed_from_), path.c_str(), took);
  // As dflash_launch.Checkpoint reports it: the run summary's "checkpoints" and "resumed from" read these.
  m_["resumed_from_step"] = resumed_from_;
  m_["restore_s"] = Round(took, 3);
  m_["checkpoint"] = {{"path", path}, {"step", resumed_from_}};
  Fill();
  WriteMetrics(r_.name, m_);
  return exit_code::kOk;
}

bool DrafterRun::Checkpoint() {
  const int64_t step = resumed_from_ + static_cast<int64_t>(losses_.size());
  if (step == 0 || step <= checkpoints_->last_step()) return true;  // nothing new since the last one
  std::string err, path;
  int committed = 0;
  if (!checkpoints_->Save(drafter_, &consumer_, step, &path, &committed, &err)) {
    Complain(r_.name, "checkpoint at step " + std::to_string(step) + ": " + err);
    return false;
  }
  m_["checkpoint"] = {{"path", path}, {"step", step}};
  m_["checkpoints_written"] = checkpoints_->written();
  m_["checkpoint_blocked_s"] = Round(checkpoints_->blocked_s(), 3);
  // The commit may have made the spool final: whoever commits the last frames writes the manifest.
  if (!manifest_ && !consumer_.WriteManifestIfFinal(ManifestPath(root_), &manifest_, &err)) Complain(r_.name, err);
  Fill();
  WriteMetrics(r_.name, m_);
  return true;
}

int DrafterRun::LoadSharedWeights() {
  std::string err;
  spool::Backoff backoff(50'000);
  for (auto t0 = Clock::now(), next_say = t0 + std::chrono::seconds(5); !Exists(paths_.Weights());) {
    if (Clock::now() >= next_say) {
      Say(r_.name, "waiting for %s from the targets (%.0fs)", paths_.Weights().c_str(), Since(t0));
      next_say += std::chrono::seconds(60);
    }
    backoff.Sleep();
  }
  safetensors::File weights;
  if (!weights.Read(paths_.Weights(), &err)) {
    Complain(r_.name, err);
    return exit_code::kFailure;
  }
  if (!drafter_.Load(weights, {"embed.weight", "lm_head.weight"}, &err)) {
    auto it = weights.header().metadata.find("producer");
    Complain(r_.name, "the shared weights " + paths_.Weights() + " from producer " +
                          (it == weights.header().metadata.end() ? "(unnamed)" : it->second) +
                          " do not match [model]: " + err + "; fix: publish the embedding and LM head of the target "
                          "[model] describes (vocab x hidden)");
    return exit_code::kFrameContract;
  }
  return exit_code::kOk;
}

int DrafterRun::TrainOn(const spool::ClaimedFrame& f) {
  std::string err, violation;
  safetensors::File file;
  if (!ReadCheckedFrame(f, &file, &violation)) {
    if (!consumer_.Reject(f, violation, &err)) Complain(r_.name, err);
    Complain(r_.name, violation + "\n(the frame is in " + paths_.Rejected() + "; nothing was consumed from it)");
    Fill();
    m_["rejected"] = f.file;
    WriteMetrics(r_.name, m_);
    return exit_code::kFrameContract;
  }
  at::Tensor hidden = TensorOf(file, *file.header().Find("hidden"));
  at::Tensor tokens = TensorOf(file, *file.header().Find("tokens"));
  auto t0 = Clock::now();
  at::Tensor loss = drafter_.Loss(hidden, tokens);
  loss.backward();
  drafter_.Step(o_.lr);
  double dt = Since(t0);
  step_s_ += dt;
  if (o_.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.pace_ms));
  if (!ReleaseFrame(f, &file, &hidden, &tokens)) return exit_code::kFailure;
  if (!consumer_.Ack(f, &err)) {
    Complain(r_.name, err);
    return exit_code::kFailure;
  }
  losses_.push_back(Round(loss.item<double>(), 5));
  // Whoever acknowledges the last frame writes the spool's manifest.
  if (!consumer_.WriteManifestIfFinal(ManifestPath(root_), &manifest_, &err)) Complain(r_.name, err);
  Report(f, dt);
  return exit_code::kOk;
}

bool DrafterRun::ReadCheckedFrame(const spool::ClaimedFrame& f, safetensors::File* file, std::string* violation) {
  std::string err;
  // Views of the file's pages, copy-on-write: no read() copy; the mapping kept for a later frame over the file.
  bool ok = file->Map(f.path, &err, spool::RingEnabled() ? maps_ : nullptr);
  if (!ok) *violation = "frame " + f.file + " from producer " + f.producer + " cannot be read: " + err;
  else if (CheckFrame(r_.m.frame, file->header(), f.file, violation)) {
    const safetensors::TensorEntry& t = *file->header().Find("tokens");
    ok = CheckTokenRange(r_.m.frame, reinterpret_cast<const int64_t*>(file->Data(t)),
                         static_cast<size_t>((t.end - t.begin) / 8), f.file, f.producer, violation);
  } else {
    ok = false;
  }
  return ok;
}

bool DrafterRun::ReleaseFrame(const spool::ClaimedFrame& f, safetensors::File* file, at::Tensor* hidden,
                              at::Tensor* tokens) {
  // Ack hands the file back to its producer, or truncates it: a view still alive would then read the producer's
  // next frame, or SIGBUS. So every view goes first, and the mapping with the last one (back to maps_); a view
  // kept anywhere (autograd) is a bug said here, not a wrong step or a crash later.
  std::weak_ptr<uint8_t> mapping = file->buffer();
  *hidden = at::Tensor();
  *tokens = at::Tensor();
  *file = safetensors::File();
  if (mapping.expired()) return true;
  Complain(r_.name, "frame " + f.file + " is still mapped after its step (a tensor kept a view of it): not "
           "acknowledging it, so its bytes are never truncated under a live view");
  return false;
}

void DrafterRun::Report(const spool::ClaimedFrame& f, double dt) {
  std::string err;
  const size_t step = losses_.size() - 1;
  if (step == 0) {
    first_step_s_ = dt;
    m_["time_to_first_step_s"] = Round(Since(t_start_), 3);  // the run summary's "first step" (training_report.h)
    Fill();
    WriteMetrics(r_.name, m_);
    char status[160];
    std::snprintf(status, sizeof status, "first step loss %.4f%s", losses_[0],
                  f.taken_back ? " (a frame taken back from an earlier attempt)" : "");
    NotifySend(std::string("READY=1\nSTATUS=") + status, &err);
    Say(r_.name, "%s; %s %s", status, r_.m.frame.dtype.c_str(), ShapeString(r_.m.frame.shape.Shape()).c_str());
  } else if (step % 50 == 0) {
    char status[96];
    std::snprintf(status, sizeof status, "step %zu loss %.4f", step, losses_.back());
    // Under dflash-worker the STATUS line reaches the console already; alone, say it.
    if (Env(env::kNotifySocket).empty()) Say(r_.name, "%s", status);
    else NotifySend(std::string("STATUS=") + status, &err);
  }
}

void DrafterRun::Fill() {
  m_["steps"] = losses_.size();
  m_["samples"] = static_cast<int64_t>(losses_.size()) * r_.m.frame.shape.batch;
  m_["first_loss"] = losses_.empty() ? json() : json(losses_.front());
  m_["last_loss"] = losses_.empty() ? json() : json(losses_.back());
  m_["losses"] = losses_;
  m_["taken_back"] = consumer_.taken_back();
  m_["frames_acked"] = consumer_.acked();
  m_["mappings_reused"] = maps_->hits();  // frames read through a mapping kept from the spool ring
  if (checkpoints_) m_["frames_committed"] = consumer_.committed();
  m_["spool_wait_s"] = Round(consumer_.waited_s(), 3);
  m_["step_s"] = Round(losses_.empty() ? 0 : step_s_ / losses_.size(), 5);
  m_["first_step_s"] = Round(first_step_s_, 3);
  m_["wall_s"] = Round(Since(t_start_), 3);
  m_["manifest_written"] = manifest_;
}

}  // namespace

// ---------------------------------------------------------------------------

int RunDrafter(const BuiltinOptions& o) {
  Role r;
  std::string root;
  if (!Setup(o, "drafter", &r)) return exit_code::kUsage;
  if (InWarmup()) return WarmUpDrafter(o, r);
  if (!SpoolRoot(r, &root)) return exit_code::kUsage;
  const int producers = std::atoi(Env(env::kSpoolProducers, "0").c_str());
  std::string checkpoint_dir;
  if (o.checkpoint_every < 0 || o.checkpoint_keep < 1) {
    Complain(r.name, "DFLASH_CHECKPOINT_EVERY must be 0 (none) or a number of steps, DFLASH_CHECKPOINT_KEEP at "
                     "least 1 (got " + std::to_string(o.checkpoint_every) + " and " +
                     std::to_string(o.checkpoint_keep) + ")");
    return exit_code::kUsage;
  }
  if (o.checkpoint_every > 0) {
    checkpoint_dir = Env(env::kCheckpointDir);
    if (checkpoint_dir.empty()) {
      Complain(r.name, "checkpoints every " + std::to_string(o.checkpoint_every) + " steps need a directory: " +
                           env::kCheckpointDir + " is not set (dflash-launch sets it to <[run] checkpoint_dir>/<role>)");
      return exit_code::kUsage;
    }
    // Each process of the role has its own (as dflash_launch.Checkpoint outside a torch.distributed world).
    checkpoint_dir += "/" + r.name;
  }
  return DrafterRun(o, r, root, producers, checkpoint_dir).Run();
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
  if (!f.Map(o.frame, &err)) {
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
  if (!w.Read(o.weights, &err) || !d.Load(w, {}, &err) || !f.Map(o.frame, &err)) {
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

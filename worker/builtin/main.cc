// dflash-builtin: the builtin LibTorch roles of dflash-launch, and the tools
// the tests use. Its own executable, so neither the supervisor nor the worker
// that hosts a user's payload ever loads LibTorch:
//   dflash-worker [--gate-dir ...] -- dflash-builtin target|drafter
// The [model] contract comes from the DFLASH_* environment dflash-launch sets.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "common/exit_codes.h"
#include "worker/builtin/roles.h"

namespace {

template <typename T>
T EnvNumber(const char* name, T fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (*end) {
    std::fprintf(stderr, "dflash-builtin: %s=%s is not a number; using %g\n", name, v, static_cast<double>(fallback));
    return fallback;
  }
  return static_cast<T>(x);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dflash;
  builtin::BuiltinOptions o;
  o.samples = EnvNumber<int64_t>("DFLASH_SAMPLES", o.samples);
  o.spool_max = EnvNumber<int>("DFLASH_SPOOL_MAX", o.spool_max);
  o.steps = EnvNumber<int64_t>("DFLASH_STEPS", o.steps);
  o.lr = EnvNumber<double>("DFLASH_LR", o.lr);
  o.pace_ms = EnvNumber<int64_t>("DFLASH_PACE_MS", o.pace_ms);
  o.threads = EnvNumber<int>("DFLASH_TORCH_THREADS", o.threads);
  o.checkpoint_every = EnvNumber<int64_t>("DFLASH_CHECKPOINT_EVERY", o.checkpoint_every);
  o.checkpoint_keep = EnvNumber<int>("DFLASH_CHECKPOINT_KEEP", o.checkpoint_keep);
  o.checkpoint_pause_ms = EnvNumber<int64_t>("DFLASH_CHECKPOINT_PAUSE_MS", o.checkpoint_pause_ms);
  o.checkpoint_adopt = EnvNumber<int>("DFLASH_CHECKPOINT_ADOPT", 0) == 1;

  CLI::App app{"The builtin LibTorch roles of dflash-launch (target, drafter) and their tools. The [model] "
               "contract comes from the DFLASH_* environment that dflash-launch sets."};
  app.set_version_flag("--version", DFLASH_VERSION);
  app.require_subcommand(1);
  app.add_option("--threads", o.threads, "intra-op threads (DFLASH_TORCH_THREADS)")->capture_default_str();
  auto* target = app.add_subcommand("target", "publish DFLASH_SAMPLES frames of tapped hidden states to the spool");
  target->add_option("--samples", o.samples, "frames to publish (DFLASH_SAMPLES)")->capture_default_str();
  target->add_option("--spool-max", o.spool_max, "pause while the spool holds this many unconsumed frames "
                                                  "(DFLASH_SPOOL_MAX)")->capture_default_str();
  auto* drafter = app.add_subcommand("drafter", "train the DFlash drafter on frames from the spool");
  drafter->add_option("--steps", o.steps, "stop after this many steps; 0 = when the spool ends (DFLASH_STEPS)")
      ->capture_default_str();
  drafter->add_option("--lr", o.lr, "AdamW learning rate (DFLASH_LR)")->capture_default_str();
  drafter->add_option("--pace-ms", o.pace_ms, "sleep this long per step, holding the frame (DFLASH_PACE_MS)")
      ->capture_default_str();
  drafter->add_option("--checkpoint-every", o.checkpoint_every,
                      "a checkpoint every N steps in $DFLASH_CHECKPOINT_DIR/<process> (dflash-launch sets it) and one "
                      "at the end; a restart resumes from the last; 0: none (DFLASH_CHECKPOINT_EVERY)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  drafter->add_option("--checkpoint-keep", o.checkpoint_keep, "keep the last K checkpoints (DFLASH_CHECKPOINT_KEEP)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  drafter->add_flag("--checkpoint-adopt", o.checkpoint_adopt,
                    "may resume from another run's checkpoint (or one without a run identity) on purpose "
                    "(DFLASH_CHECKPOINT_ADOPT=1); without it that is refused, exit 78");
  auto* export_target = app.add_subcommand("export-target", "write the target's seeded weights (safetensors)");
  export_target->add_option("--out", o.out, "output file")->required();
  auto* init_drafter = app.add_subcommand("init-drafter", "write the drafter's seeded initial weights (safetensors)");
  init_drafter->add_option("--out", o.out, "output file")->required();
  auto* tap = app.add_subcommand("tap", "write one frame exactly as a target publishes it");
  tap->add_option("--rank", o.rank, "the target's ROLE_RANK")->capture_default_str();
  tap->add_option("--seq", o.seq, "the sample's sequence number")->capture_default_str();
  tap->add_option("--out", o.out, "output file")->required();
  auto* loss = app.add_subcommand("loss", "print the drafter's loss on one frame from given weights (JSON)");
  loss->add_option("--weights", o.weights, "every drafter parameter (safetensors)")->required();
  loss->add_option("--frame", o.frame, "a frame (safetensors)")->required();
  loss->add_option("--steps", o.steps, "training steps on that frame (AdamW); losses of each")->capture_default_str();
  loss->add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  auto* check = app.add_subcommand("check-frame", "check one frame against the [model] contract");
  check->add_option("frame", o.frame, "a frame (safetensors)")->required();
  app.footer("Exit status: 0 ok; 1 runtime failure; 64 usage or no [model] contract in the environment; "
             "65 a frame or the shared weights violate the contract (the message names the producer and the fix).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : exit_code::kUsage;
  }
  // A LibTorch op that throws on data it was given (a token id outside the
  // vocabulary, say) must not abort (134, a core, a "crash" in the summary):
  // it is a runtime failure, exit 1, with LibTorch's message.
  try {
    if (*target) return builtin::RunTarget(o);
    if (*drafter) return builtin::RunDrafter(o);
    if (*export_target) return builtin::ExportTarget(o);
    if (*init_drafter) return builtin::InitDrafter(o);
    if (*tap) return builtin::Tap(o);
    if (*loss) return builtin::Loss(o);
    if (*check) return builtin::CheckFrameFile(o);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "dflash-builtin: out of memory\n");
    return exit_code::kFailure;
  } catch (const std::exception& e) {
    // c10::Error's what() carries a C++ backtrace after the message: keep the message.
    std::string what = e.what();
    size_t cut = what.find("\nException raised from");
    if (cut == std::string::npos) cut = what.find("\nframe #");
    std::fprintf(stderr, "dflash-builtin: %s\n", what.substr(0, cut).c_str());
    return exit_code::kFailure;
  }
  return exit_code::kUsage;
}

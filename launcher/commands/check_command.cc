#include <cstdio>

#include "common/exit_codes.h"
#include "launcher/commands/commands.h"
#include "launcher/commands/front_door.h"
#include "launcher/metrics/run_metrics.h"
#include "launcher/plan/plan_format.h"
#include "launcher/plan/script_imports.h"

namespace dflash {

int RunCheck(const CheckOptions& opts, char** env) {
  RunConfig config;
  if (Status s = LoadConfigFile(opts.config, &config); !s.ok()) return Say(s);
  Plan plan;
  if (Status s = PlanThisNode(config, opts.nodes, opts.run_id, "<run_id>", opts.bin_dir, env, &plan); !s.ok())
    return Say(s);
  Say(BuiltinInstalled(config, opts.bin_dir, /*warn_only=*/true));  // a warning: the plan itself is valid
  std::fputs(FormatWarnings(ConfigWarnings(config)).c_str(), stderr);
  if (Status s = CommandsRun(plan.config, env); !s.ok()) return Say(s);
  const RunSpec& run = plan.config.run;
  if (!run.metrics.empty() && run.metrics_pos.line > 0 && !RunMetrics::Available())
    std::fprintf(stderr,
                 "%s: warning: [run] metrics: this dflash-launch was built without prometheus-cpp: the run will "
                 "serve no metrics\n    hint: a source build (`make build`) or a wheel built where "
                 "prometheus-cpp-dev is installed (docs/wheel.md) serves them; or metrics = false\n",
                 run.metrics_pos.ToString().c_str());
  // Warnings: the script may add its own sys.path; python's error would come seconds into the run.
  std::fputs(FormatUnresolvedImports(UnresolvedImports(plan.config, EnvironmentList(env))).c_str(), stderr);
  // With a run id: its run dir, as `run` will check it (another user's link or dir there is refused).
  if (!opts.run_id.empty()) {
    std::string err;
    if (!CheckSecurePath(plan.run_dir, RunDirUse(), &err)) {
      std::fprintf(stderr, "%s: run.log_dir: %s\n", config.path.c_str(), err.c_str());
      return exit_code::kConfig;
    }
  }
  if (Status s = HostLimitsFit(plan, env); !s.ok()) return Say(s);
  std::fputs((opts.json ? PlanJson(plan) : PlanText(plan)).c_str(), stdout);
  return exit_code::kOk;
}

}  // namespace dflash

#include <cstdio>

#include "common/exit_codes.h"
#include "launcher/command_check.h"
#include "launcher/commands.h"
#include "launcher/plan_format.h"
#include "launcher/torch_version.h"

namespace dflash {

EnvList EnvironmentList(char** env) {
  EnvList out;
  for (char** e = env; e && *e; ++e) {
    std::string s(*e);
    size_t eq = s.find('=');
    if (eq != std::string::npos) out.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return out;
}

bool LoadConfigOrReport(const std::string& path, RunConfig* config) {
  std::vector<ConfigError> errors;
  if (LoadConfig(path, config, &errors)) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

bool CommandsRunOrReport(const RunConfig& config, char** env) {
  std::vector<ConfigError> errors = CheckCommands(config, EnvironmentList(env));
  if (errors.empty()) return true;
  std::fputs(FormatErrors(errors).c_str(), stderr);
  return false;
}

bool LoadPlanOrReport(const std::string& path, const std::string& run_id, const std::string& bin_dir, char** env,
                      Plan* plan) {
  RunConfig config;
  if (!LoadConfigOrReport(path, &config)) return false;
  PlanOptions po;
  po.run_id = run_id;
  po.bin_dir = bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = EnvironmentList(env);
  *plan = BuildPlan(config, po);
  return true;
}

int RunCheck(const CheckOptions& opts, char** env) {
  Plan plan;
  if (!LoadPlanOrReport(opts.config, "<run_id>", opts.bin_dir, env, &plan)) return exit_code::kConfig;
  if (!CommandsRunOrReport(plan.config, env)) return exit_code::kConfig;
  std::fputs((opts.json ? PlanJson(plan) : PlanText(plan)).c_str(), stdout);
  return exit_code::kOk;
}

}  // namespace dflash

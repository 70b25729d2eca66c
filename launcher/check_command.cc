#include <cstdio>

#include "common/exit_codes.h"
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

int RunCheck(const CheckOptions& opts, char** env) {
  RunConfig config;
  if (!LoadConfigOrReport(opts.config, &config)) return exit_code::kConfig;
  PlanOptions po;
  po.bin_dir = opts.bin_dir;
  po.torch_version = TorchVersionFor;
  po.launcher_env = EnvironmentList(env);
  Plan plan = BuildPlan(config, po);
  std::fputs((opts.json ? PlanJson(plan) : PlanText(plan)).c_str(), stdout);
  return exit_code::kOk;
}

}  // namespace dflash

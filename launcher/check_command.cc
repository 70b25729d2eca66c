#include <unistd.h>

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

bool BuiltinInstalledOrReport(const RunConfig& config, const std::string& bin_dir, bool warn_only) {
  std::string path = bin_dir + "/dflash-builtin";
  if (::access(path.c_str(), X_OK) == 0) return true;
  for (const RoleSpec& r : config.roles) {
    if (r.builtin.empty()) continue;
    std::fprintf(stderr,
                 "%s: %s: role[%s].builtin: dflash-builtin is not installed beside dflash-launch (%s)\n"
                 "    hint: builtin roles need a source build (`make build`, against your torch's LibTorch); the pip "
                 "wheel leaves dflash-builtin out (docs/wheel.md). Or give the role a command.\n",
                 r.pos.ToString().c_str(), warn_only ? "warning" : "error", r.name.c_str(), path.c_str());
    if (!warn_only) std::fputs("nothing was started.\n", stderr);
    return warn_only;
  }
  return true;
}

int RunCheck(const CheckOptions& opts, char** env) {
  Plan plan;
  if (!LoadPlanOrReport(opts.config, "<run_id>", opts.bin_dir, env, &plan)) return exit_code::kConfig;
  RunConfig config;
  if (LoadConfigOrReport(opts.config, &config)) BuiltinInstalledOrReport(config, opts.bin_dir, /*warn_only=*/true);
  std::fputs((opts.json ? PlanJson(plan) : PlanText(plan)).c_str(), stdout);
  return exit_code::kOk;
}

}  // namespace dflash

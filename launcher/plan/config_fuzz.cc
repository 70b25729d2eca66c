// libFuzzer target: any bytes through the config loader and the plan printers.
// `make fuzz` runs it for 60 s under ASan/UBSan/LSan with toml++ compiled in
// (header-only), seeded from tests/configs and configs/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "launcher/config/config.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/plan_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dflash::RunConfig config;
  std::vector<dflash::ConfigError> errors;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (dflash::LoadConfigFromString(text, "/fuzz/run.toml", &config, &errors)) {
    dflash::PlanOptions po;
    po.bin_dir = "/bin";
    po.torch_version = [](const dflash::RoleSpec&) { return std::string("fuzz"); };
    dflash::Plan plan = dflash::BuildPlan(config, po);
    (void)dflash::PlanText(plan);
    (void)dflash::PlanJson(plan);
  } else {
    (void)dflash::FormatErrors(errors);
  }
  return 0;
}

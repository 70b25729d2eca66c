// `dflash-launch check` output: the plan for people (text) and for tools (--json,
// format "dflash-plan/1", documented in docs/check-json.md).
#pragma once

#include <string>

#include "launcher/plan/plan.h"

namespace dflash {

std::string PlanText(const Plan& plan);
std::string PlanJson(const Plan& plan);

/// One line per role: "restart on-failure (scope role, max 3 in 30m, backoff 5s..2m, reset after 10m)".
std::string DescribeRestart(const RestartSpec& r);
std::string DescribeReady(const ReadySpec& r);
/// An environment value as the plan shows it: secrets redacted, URLs without their credentials.
std::string ShownEnvValue(const std::string& name, const std::string& value);

}  // namespace dflash

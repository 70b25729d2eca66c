// The roles as a stack: who starts after whom (`after`, and services before
// the rest), checked for unknown names and cycles, and the start phases that
// follow from it. Pure: config validation fills RoleSpec::starts_after and
// RoleSpec::phase from it, the supervisor only reads those.
#pragma once

#include <string>
#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// Fills every role's starts_after (its `after`, plus every service for a role
/// that is not one) and phase (0: nothing to wait for; else one more than the
/// latest of those it starts after). Unknown names, a role after itself, a
/// service after a role that is not one, and cycles are errors at the name's
/// file:line:col. Roles whose names failed to parse are skipped.
void ResolveRoleOrder(std::vector<RoleSpec>* roles, std::vector<ConfigError>* errors);

/// "redis, then target, then drafter", phases joined by ", then " and the
/// roles of one phase by " + " (`check` prints it).
std::string DescribeStartOrder(const std::vector<RoleSpec>& roles);

}  // namespace dflash

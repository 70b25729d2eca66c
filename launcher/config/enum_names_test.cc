// Enum spellings written once: every value has one name, the parser reads back
// what the printer writes, and the schema offers exactly the table's names.
#include <gtest/gtest.h>

#include "contract/defaults.h"
#include "contract/ready_spec.h"
#include "launcher/config/config.h"
#include "launcher/config/schema.h"
#include "testing/enum_names_check.h"

namespace dflash {
namespace {

TEST(EnumNamesTest, EveryEnumHasOneNamePerValueAndReadsBack) {
  ExpectOneNameEachAndRoundTrip(kReadyModeNames, {ReadyMode::kNone, ReadyMode::kExit, ReadyMode::kNotify,
                                                  ReadyMode::kFile, ReadyMode::kLog, ReadyMode::kTcp, ReadyMode::kHttp});
  ExpectOneNameEachAndRoundTrip(kReadyStreamNames, {ReadySpec::Stream::kStdout, ReadySpec::Stream::kStderr,
                                                    ReadySpec::Stream::kBoth});
  ExpectOneNameEachAndRoundTrip(kGateModeNames, {GateMode::kAuto, GateMode::kWarmup, GateMode::kSerial});
  ExpectOneNameEachAndRoundTrip(kRestartPolicyNames,
                                {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways});
  ExpectOneNameEachAndRoundTrip(kRestartScopeNames, {RestartScope::kProcess, RestartScope::kRole, RestartScope::kAll});
}

TEST(EnumNamesTest, TheSchemaOffersExactlyTheTablesNames) {
  EXPECT_EQ(FindKey("role.ready", "mode")->choices, NamesIn(kReadyModeNames));
  EXPECT_EQ(FindKey("role.ready", "stream")->choices, NamesIn(kReadyStreamNames));
  EXPECT_EQ(FindKey("role.gate", "mode")->choices, NamesIn(kGateModeNames));
  EXPECT_EQ(FindKey("role.restart", "policy")->choices, NamesIn(kRestartPolicyNames));
  EXPECT_EQ(FindKey("role.restart", "scope")->choices, NamesIn(kRestartScopeNames));
}

TEST(EnumNamesTest, TheSchemasDefaultsAreTheStructsDefaults) {
  // A default lives in the struct; the schema (and docs/config.md, generated) prints it.
  EXPECT_EQ(FindKey("role.gate", "mode")->default_value, NameIn(kGateModeNames, GateSpec{}.mode));
  EXPECT_EQ(FindKey("role.restart", "policy")->default_value, NameIn(kRestartPolicyNames, RestartSpec{}.policy));
  EXPECT_EQ(FindKey("role.restart", "scope")->default_value, NameIn(kRestartScopeNames, RestartSpec{}.scope));
  EXPECT_EQ(FindKey("role.ready", "stream")->default_value, NameIn(kReadyStreamNames, ReadySpec{}.stream));
  EXPECT_EQ(FindKey("role.gate", "timeout")->default_value, FormatDuration(kDefaultGateTimeout));
  EXPECT_EQ(FindKey("role.gate", "idle_hint")->default_value, FormatDuration(kDefaultGateIdleHint));
}

}  // namespace
}  // namespace dflash

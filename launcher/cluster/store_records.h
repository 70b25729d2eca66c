// The records other launchers leave in the store (failures, the round, registrations) are input from
// whoever could write the store: each is checked here before it counts. An invalid one is ignored
// (the coordinator logs it once), never acted on: a failure naming node 9 of a 2-node run, or one
// that claims exit code 0, stops nobody.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "launcher/core/node_culprit.h"

namespace dflash {

/// {node: 0..nnodes-1, exit_code: null or a non-zero int in -255..255 (a lost launcher has none),
/// process: null or a short string, reason: a string, how: absent or one of "failed", "lost",
/// "replaced", "left behind"}; nothing else is required, nothing checked beyond. False: `why` says
/// what is wrong.
bool ValidFailureRecord(const nlohmann::json& record, int nnodes, std::string* why);

/// Who a valid failure record names, the same way on every node that reads it, whichever path found
/// the failure (its own node, the watcher, a node left behind): "how" picks the culprit's kind
/// (absent: "failed", as records written before it had one).
NodeCulprit FailureCulprit(const nlohmann::json& record);

/// The round counter's text: "" (none yet: 0) or decimal digits, at most `seen` + 1000 (a round is
/// one step per restart; a jump past that is no round of this run). False: `why`.
bool ParseRoundRecord(const std::string& text, int seen, int* round, std::string* why);

/// A registration's nonce (32 lower-case hex digits, what RandomNonce draws) and heartbeat (digits).
bool ValidRegistration(const std::string& nonce, const std::string& heartbeat);

}  // namespace dflash

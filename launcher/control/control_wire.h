// The control socket's wire format: one JSON object per line each way
// (docs/control.md). Shared by the server (launcher/control/control_server.h) and the
// `ctl` client (launcher/control/control_client.h), so both speak exactly one protocol.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "launcher/control/control.h"

namespace dflash {

/// The longest request line the server reads (a request is a verb, a target and
/// a signal number: a few dozen bytes). A longer line is refused, not buffered.
constexpr size_t kMaxControlRequestBytes = 4096;

/// {"verb":"restart","target":"drafter"}, {"verb":"signal","target":"x","signal":10}.
std::string EncodeRequest(const ControlRequest& r);
/// False with `err` ("unknown verb \"reboot\"; verbs: status, restart, ...") if
/// `line` is not a request: not JSON, not an object, an unknown verb, no target
/// for a verb that needs one, a signal out of 1..64, a key given twice in one
/// object ({"verb":"status","verb":"restart"}: which one counts is up to the parser).
bool DecodeRequest(const std::string& line, ControlRequest* out, std::string* err);

/// {"ok":true,"body":...} or {"ok":false,"error":"..."}; one line, '\n' added.
std::string EncodeReply(const ControlReply& r);
bool DecodeReply(const std::string& line, ControlReply* out, std::string* err);

}  // namespace dflash

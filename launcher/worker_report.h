// What a process tells the supervisor over NOTIFY_SOCKET (the systemd notify
// protocol plus dflash-worker's X_DFLASH_* facts), decoded in one place.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/notify.h"

namespace dflash {

/// What a process told us over NOTIFY_SOCKET, decoded once (ReportFromNotify in
/// the shell). Every field is optional: a datagram carries some of them.
struct WorkerReport {
  std::optional<pid_t> main_pid;             // MAINPID=: the payload under the worker
  std::optional<std::string> error;          // X_DFLASH_ERROR=: the worker could not execute it
  std::optional<std::string> payload_exit;   // X_DFLASH_EXIT=: "killed by SIGSEGV (core dumped)"
  std::optional<int> payload_signal;         // X_DFLASH_SIGNAL=
  std::optional<double> ready_s;             // X_DFLASH_READY_S=
  std::optional<std::string> status;         // STATUS=
  std::vector<std::string> gate_warnings;    // X_DFLASH_GATE_WARNING=
  nlohmann::json gate;                       // X_DFLASH_GATE_* (lower-cased, numbers as numbers) or null
  bool ready = false;                        // READY=1
  bool watchdog = false;                     // WATCHDOG=1
};

/// Decodes one datagram (the protocol's field names: worker/gated_run.cc sends
/// them). The one place the supervisor reads a notify field: once
/// worker/protocol.h lands, its body is DecodeNotify(m.fields) mapped here.
WorkerReport ReportFromNotify(const NotifyMessage& m);

}  // namespace dflash

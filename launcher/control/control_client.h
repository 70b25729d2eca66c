// The `ctl` side of the control socket: connect only to a socket that no one but
// us could have made, ask one thing, read one reply, never wait forever.
#pragma once

#include <chrono>
#include <string>

#include "common/fd.h"
#include "launcher/control/control.h"

namespace dflash {

enum class ConnectResult {
  kOk,
  kGone,      // no socket, or nobody listening: the run has ended
  kInsecure,  // the run dir or the socket could be another user's doing: refused
  kFailed,    // anything else (the error says what)
};

/// Connects to `<run_dir>/control.sock`. Before connecting: the run dir must be
/// ours and not writable by group/others, the socket must be a socket (not a
/// link), ours, mode 0600 or stricter. After: the listener's SO_PEERCRED uid must
/// be ours. A 0777 socket or run dir is refused even if it is ours: anyone could
/// have been talking to it, or could have put it there.
ConnectResult ConnectControl(const std::string& run_dir, UniqueFd* out, std::string* err);

/// Sends one request and reads its reply line within `timeout`. False with
/// `err` if the run did not answer in time, hung up, or answered nonsense.
bool CallControl(int fd, const ControlRequest& request, ControlReply* reply,
                 std::chrono::milliseconds timeout, std::string* err);

}  // namespace dflash

// The systemd notify protocol (sd_notify(3)), both ends: payloads send
// "READY=1" to $NOTIFY_SOCKET; the worker listens on a socket of its own.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/fd.h"

namespace dflash {

/// Sends one datagram to $NOTIFY_SOCKET, e.g. "READY=1" or "STATUS=compiling".
/// A no-op returning true when the variable is unset or empty, as sd_notify
/// does: a payload runs the same under the worker, under systemd, or alone.
bool NotifySend(std::string_view message, std::string* err);

/// Sends one datagram to `address`: a socket path, or "@name" for the
/// abstract namespace (as NOTIFY_SOCKET spells it).
bool NotifySendTo(std::string_view address, std::string_view message, std::string* err);

/// One datagram as received, with the sender's kernel-checked credentials.
struct NotifyMessage {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  /// The sender's process group when the datagram was read; -1 if the sender
  /// had already exited and been reaped. (systemd-notify stays alive until its
  /// BARRIER fd is closed, which happens after its READY=1 was read.)
  pid_t pgid = -1;
  /// The KEY=VALUE lines in order; lines without '=' are dropped.
  std::vector<std::pair<std::string, std::string>> fields;

  /// The value of the last line with `key`, if any.
  std::optional<std::string> Get(std::string_view key) const;
  bool Has(std::string_view key, std::string_view value) const;
};

/// Counters of what Receive() discarded, for diagnostics and tests.
struct NotifyStats {
  size_t received = 0;        ///< datagrams accepted
  size_t foreign_uid = 0;     ///< rejected: sent by another user
  size_t truncated = 0;       ///< rejected: datagram or control data truncated
  size_t no_credentials = 0;  ///< rejected: no SCM_CREDENTIALS (cannot happen with SO_PASSCRED)
  size_t fds_closed = 0;      ///< fds that arrived with SCM_RIGHTS and were closed
};

/// The receiving end: an AF_UNIX datagram socket (SOCK_CLOEXEC|SOCK_NONBLOCK)
/// with SO_PASSCRED, so every datagram carries its sender's pid/uid/gid.
class NotifyListener {
 public:
  NotifyListener() = default;
  NotifyListener(const NotifyListener&) = delete;
  NotifyListener& operator=(const NotifyListener&) = delete;
  /// Closes the socket; unlinks it if it was bound to a path.
  ~NotifyListener();

  /// Binds a fresh abstract address "@dflash/<pid>/<counter>/<random>": no
  /// file to clean up, nothing left behind when the process dies.
  bool Open(std::string* err);
  /// Binds an explicit address (path or "@abstract").
  bool Open(std::string_view address, std::string* err);

  /// The value to put in a child's NOTIFY_SOCKET.
  const std::string& address() const { return address_; }
  /// Readable when datagrams are pending: put it in epoll/ppoll.
  int fd() const { return fd_.get(); }

  /// Drains every pending datagram (never blocks) and appends the accepted
  /// ones to `out`. File descriptors passed with SCM_RIGHTS are closed at
  /// once: that is what releases `systemd-notify --ready`, which sends
  /// BARRIER=1 with an fd and waits for the receiver to close it (ignoring it
  /// costs a 5 s hang and exit 1). Datagrams from other uids, or truncated
  /// ones, are dropped and counted. False only on a socket error.
  bool Receive(std::vector<NotifyMessage>* out, std::string* err);

  const NotifyStats& stats() const { return stats_; }

 private:
  UniqueFd fd_;
  std::string address_;
  std::string unlink_path_;
  NotifyStats stats_;
};

/// Parses "KEY=VALUE\nKEY=VALUE" (a trailing newline or none).
std::vector<std::pair<std::string, std::string>> ParseNotifyFields(std::string_view text);

}  // namespace dflash

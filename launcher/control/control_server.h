// The run's control socket, <run_dir>/control.sock: `dflash-launch ctl` talks to
// the supervisor through it (docs/control.md). Served from the supervisor's own
// event loop, never from a thread of its own: every request reaches the
// ControlHandler on the loop thread, between two other events.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include "common/fd.h"
#include "launcher/control/control.h"

namespace dflash {

/// An AF_UNIX stream socket, mode 0600 in a run dir only we may write to; a peer
/// whose SO_PEERCRED uid is not ours gets one error line and is closed. One JSON
/// request per line, one JSON reply line each (launcher/control/control_wire.h).
///
/// Nothing a client does can block the loop: every fd is non-blocking, the
/// clients are multiplexed on an epoll fd of the server's (`fd()`), a request
/// line is bounded (kMaxControlRequestBytes), replies not taken yet are bounded
/// too, and so is the number of clients: when all slots are taken, the client
/// idle the longest is dropped for the newcomer. A client silent for
/// `idle_timeout` is dropped at the next event.
class ControlServer {
 public:
  struct Options {
    size_t max_clients = 16;
    std::chrono::milliseconds idle_timeout{10000};
    size_t max_unsent_bytes = 16 << 20;  // replies a client has not read yet
  };

  ControlServer() : ControlServer(Options{}) {}
  explicit ControlServer(Options options) : options_(options) {}
  /// Close(): the socket file goes with the server.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  /// Creates `<run_dir>/control.sock` and listens. Refuses a run dir that is not
  /// ours or that group/others may write to (they could swap the socket). The
  /// socket is made under a temporary name and renamed into place, so a file,
  /// a symlink or a stale socket already at the path is replaced, never
  /// followed; a directory there is an error.
  bool Open(const std::string& run_dir, std::string* err);

  /// An epoll fd, readable when the listener or a client wants service: add it
  /// to the loop's epoll (EPOLLIN) and call OnReadable() when it fires. -1
  /// before Open().
  int fd() const { return epoll_.get(); }

  /// Accepts, reads, answers and drops clients, without ever blocking.
  void OnReadable(ControlHandler& handler);

  /// Drops the clients silent for longer than idle_timeout. OnReadable() does it
  /// too; a loop may call it from its periodic work so that a silent client
  /// goes even when nothing else happens.
  void DropIdle();

  /// Closes every client and the listener, and unlinks the socket file if it
  /// is still the one we made. Idempotent.
  void Close();

  const std::string& path() const { return path_; }
  size_t clients() const { return clients_.size(); }

 private:
  struct Client {
    UniqueFd fd;
    std::string in, out;
    std::chrono::steady_clock::time_point last_active;
    bool closing = false;  // close once `out` is sent
    uint32_t events = 1;   // what epoll watches for it (EPOLLIN at first)
  };

  void Accept();
  /// False: the client is gone (removed).
  bool Serve(size_t index, uint32_t events, ControlHandler& handler);
  void HandleLine(Client& c, const std::string& line, ControlHandler& handler);
  /// Writes what it can of `out`; false if the client must go.
  bool Flush(Client& c);
  void Drop(size_t index);

  Options options_;
  UniqueFd epoll_, listener_, dir_;
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::vector<Client> clients_;
};

}  // namespace dflash

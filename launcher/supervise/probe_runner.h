// The tries of the supervisor's network probes (ready = tcp/http, liveness),
// on its own epoll: each try is a non-blocking common/net_probe.h socket with
// a deadline, so a server that accepts and never answers, or an address that
// drops SYNs, costs one fd and at most its probe_timeout -- the loop that
// supervises every process never waits on one. What a try saw is judged by
// contract/probe_spec.h JudgeProbe; the core (supervisor_core.h) decides.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/net_probe.h"
#include "contract/probe_spec.h"
#include "launcher/plan/plan.h"

namespace dflash {

/// Whether `port` is one of the ports reserved for `p` (its role's `ports`): the probes of those are proven.
bool ReservedFor(const ProcessPlan& p, int port);

class ProbeRunner {
 public:
  struct Result {
    size_t index = 0;  ///< the process
    uint64_t seq = 0;  ///< the core's try number, handed back
    bool answered = false;
    std::string detail;  ///< "HTTP 200", "connection refused", "no answer within 1s"
    bool foreign = false;  ///< another's process accepted the try or holds the port: `detail` names it
  };

  /// Tries are added to `epoll_fd` with data.u64 = tag_base | try id.
  ProbeRunner(int epoll_fd, uint64_t tag_base) : epoll_(epoll_fd), tag_base_(tag_base) {}
  ~ProbeRunner();

  /// Starts a try of `spec` (which must outlive it) for process `index`. With an
  /// `owner` (the process, a session leader), a try counts only if it was
  /// answered by `owner`'s tree (common/listener_owner.h): an http try sends its
  /// request only once the socket that accepted the connection is proven to be
  /// the tree's (ProvePeer; one accepted by anyone else fails the try at once),
  /// a tcp try fails if another's process accepted it, and either counts only
  /// if the port's listener is the tree's after the answer (ProveListener). A
  /// port reserved for the process (ReservedFor) is reserved against the user's
  /// other runs only: another user who binds it first, accepts, and hands the
  /// port over before answering must not make the process ready. `owner` <= 0:
  /// not checked.
  void Start(size_t index, uint64_t seq, const ProbeSpec& spec, SteadyTime now, pid_t owner = -1);
  /// epoll said try `id` is ready.
  void OnReady(uint32_t id);
  /// Ends every try whose probe_timeout passed by `now`.
  void Expire(SteadyTime now);
  /// The earliest try deadline (SteadyTime::max(): none out).
  SteadyTime NextDeadline() const;
  /// The tries that ended since the last call.
  std::vector<Result> TakeDone();
  bool HasDone() const { return !done_.empty(); }

 private:
  struct Try {
    size_t index = 0;
    uint64_t seq = 0;
    pid_t owner = -1;
    const ProbeSpec* spec = nullptr;
    SteadyTime deadline{};
    uint32_t events = 0;  ///< what epoll waits for now
    SteadyTime recheck = SteadyTime::max();  ///< held: when to look again for who accepted it
    NetProbe probe;
  };
  void Finish(uint32_t id, const std::string& timeout_detail = "", bool foreign = false);
  /// Sets epoll to what the try's probe waits for now.
  void Rearm(uint32_t id, Try& t);
  /// A held try: who accepted its connection? The tree: the request goes. Another: the try fails. Nobody yet:
  /// again at `now` + kRecheck.
  void CheckPeer(uint32_t id, SteadyTime now);
  /// A connect-only try: was it accepted by another's process? (Still queued, or the tree's: no.)
  static bool AcceptedByAnother(const Try& t, std::string* detail);
  /// The try answered: is the named port's listener the owner's? False: `detail` says whose it is.
  static bool ProveOwnPort(const Try& t, std::string* detail, bool* foreign);

  int epoll_;
  uint64_t tag_base_;
  uint32_t next_id_ = 0;
  std::map<uint32_t, std::unique_ptr<Try>> tries_;
  std::vector<Result> done_;
};

}  // namespace dflash

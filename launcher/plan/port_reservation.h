// MASTER_PORT, ROLE_MASTER_PORT and the roles' named ports (`ports = ["http"]`) without collisions: two runs on one host
// never share a port, and a port in use is an error before anything starts.
//
// Why a lock file per port and not a held socket: the run's rank 0 must bind
// the port itself (torch's TCPStore listens on MASTER_PORT with SO_REUSEADDR
// but not SO_REUSEPORT), so the launcher cannot keep it bound. It probes that
// the port is bindable the way the store will bind it, then holds
// <lock_dir>/<port>.lock (flock) for the whole run: every other dflash-launch on
// the host skips (auto) or refuses (explicit) that port. Programs that are not
// dflash-launch are not excluded between the probe and rank 0's bind; "auto"
// draws ports in [20000, 32767), below Linux's ephemeral range, so outgoing
// connections (whose source ports come from that range) do not take them.
#pragma once

#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "launcher/plan/plan.h"

namespace dflash {

/// This user's directory of port locks, one only this user can write or read:
/// /tmp/dflash-ports-<uid> (0700), or if that is not ours (another user made it
/// first, a symlink) $XDG_RUNTIME_DIR/dflash-ports, then ~/.cache/dflash-ports
/// (`warning` then says which was skipped and why). Other users' runs are not
/// excluded by locks: the bind probe still refuses a port they hold.
bool PortLockDir(std::string* dir, std::string* warning, std::string* err);

/// Whether `port` can be bound on every IPv4 and IPv6 address with
/// SO_REUSEADDR, as rank 0's store will bind it. False: `why` says what failed.
bool PortBindable(int port, std::string* why);

/// The locks this run holds; dropping them frees the ports for other runs.
struct PortReservations {
  std::vector<UniqueFd> locks;
};

/// kBadLock: the port's lock file cannot be used (a symlink, a directory): ReserveFreePort draws another port.
enum class ReserveResult { kReserved, kInUse, kFailed, kBadLock };

/// Reserves one given port: kInUse with `err` naming the holder (another
/// dflash-launch's record, or the bind error) if it is taken.
ReserveResult ReservePort(const std::string& lock_dir, int port, const std::string& record, PortReservations* held,
                          std::string* err);

/// Picks and reserves a free port in [20000, 32767) (random candidates).
ReserveResult ReserveFreePort(const std::string& lock_dir, const std::string& record, int* port,
                              PortReservations* held, std::string* err);

/// Resolves the plan's "auto" ports (one node) and reserves every port this
/// node's processes will bind (MASTER_PORT if it hosts rank 0, each
/// ROLE_MASTER_PORT whose role rank 0 is here). kInUse: exit 69, nothing spawned.
ReserveResult ReservePlanPorts(Plan* plan, const std::string& lock_dir, PortReservations* held, std::string* err);

/// Reserves a free port per name of each role's `ports` for each of this node's
/// processes and warm-ups (ProcessPlan::ports), held like the master ports: for
/// the whole run, so a restarted process gets its own again. kInUse: no free port
/// left to draw; kFailed: a lock could not be made (e.g. out of file descriptors).
ReserveResult ReserveNamedPorts(Plan* plan, const std::string& lock_dir, PortReservations* held, std::string* err);

/// ReservePlanPorts and ReserveNamedPorts in the default lock dir (PortLockDir; its `warning`, if any, for the
/// caller to say). Exit codes: 69 (a port is taken: nothing may be spawned) or 73.
Status ReserveRunPorts(Plan* plan, PortReservations* held, std::string* warning);

}  // namespace dflash

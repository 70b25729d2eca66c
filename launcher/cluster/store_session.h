// A run's side of the coordination store (docs/multinode.md, "The store"): before
// anything starts, the private redis-server (node 0, store = "private"), this
// node's registration and the start barrier; after the run, "done" and the
// private store's end once the other nodes are done. run_command.cc wires the
// coordinator's events into the supervisor's loop between the two.
#pragma once

#include <spdlog/logger.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "launcher/cluster/node_coordinator.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/port_reservation.h"
#include "launcher/cluster/private_store.h"

namespace dflash {

struct StoreSession {
  std::unique_ptr<PrivateStore> private_store;
  std::unique_ptr<NodeCoordinator> coordinator;
};

/// <run_dir>/store.secret: the store's password for the run's processes (0600; DFLASH_STORE_SECRET_FILE),
/// written by OpenStoreSession, removed by CloseStoreSession.
std::string StoreSecretPath(const Plan& plan);

/// Resolves the store's password ([run] store_password_file / _env; a private store of one node draws a
/// random one; of several nodes, without one: exit 64), resolves and reserves a private store's port (one node: a free one), starts
/// it on node 0, registers this node and waits at the start barrier (SIGINT,
/// SIGTERM, SIGHUP end the wait; they are blocked, so read from a signalfd).
/// Returns ok, or the exit code with the reason (in `log` already; the caller says it): nothing was started.
/// Meanwhile `note` is told what the run does (a note from the store, the wait at the barrier; each in `log`
/// too): the command says it on its console, since nothing below commands/ prints.
Status OpenStoreSession(Plan* plan, PortReservations* ports, const std::vector<std::string>& env,
                        const std::shared_ptr<spdlog::logger>& log,
                        const std::function<void(const std::string&)>& note, StoreSession* session);

/// After the run: publishes done (and the failure, if any and not yet), unregisters;
/// node 0 with a private store keeps it up until every other node is done or gone
/// (at most store_barrier_timeout), then stops it.
void CloseStoreSession(const Plan& plan, int exit_code, const std::string& reason,
                       const std::shared_ptr<spdlog::logger>& log, StoreSession* session);

}  // namespace dflash

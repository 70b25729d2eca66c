#include <csignal>

#include "common/signal_fd.h"
#include "worker/cachelock_run.h"

int main(int argc, char** argv) {
  // Taken only from the payload host's signalfd, never delivered asynchronously.
  dflash::BlockSignals({SIGCHLD, SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2});
  return dflash::CachelockRunMain(argc, argv);
}

// `dflash-cachelock`: status / forget, the command-line face of CompileGate; `run`
// forwards to dflash-cachelock-run (worker/cachelock_run.h), which hosts the command.
#pragma once

namespace dflash {

/// The whole CLI; returns the process exit status (see docs/cachelock.md):
/// 75 gate timeout, 73 gate dir insecure or not creatable, 64 bad usage or key;
/// `run` execs dflash-cachelock-run (127 if it is not installed beside us).
int CachelockMain(int argc, char** argv);

}  // namespace dflash

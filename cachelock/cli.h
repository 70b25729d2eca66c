// `dflash-cachelock`: run / status / forget, the command-line face of CompileGate.
#pragma once

namespace dflash {

/// The whole CLI; returns the process exit status (see docs/cachelock.md):
/// CMD's own status (128+N if it was killed by signal N), 75 gate timeout,
/// 73 gate dir insecure or not creatable, 64 bad usage or key.
int CachelockMain(int argc, char** argv);

}  // namespace dflash

// `dflash-cachelock-run DIR --key K [--ready ...] -- CMD`: the compile gate for any
// script, on the worker's side of the layers (it hosts CMD with RunGatedPayload, as
// dflash-worker does); `dflash-cachelock run ...` forwards here. The gate
// library and its CLI (`status`, `forget`) include nothing of worker/.
#pragma once

namespace dflash {

/// The whole CLI; returns the exit status (docs/cachelock.md): CMD's own
/// (128+N if signal N killed it), 127/126 if CMD cannot be executed, 75 gate
/// or readiness timeout, 73 gate dir insecure or not creatable, 64 usage.
/// `argv[1]` may be "run" (the old `dflash-cachelock run` spelling).
/// REQUIRES: single-threaded, or the host's signals blocked (BlockSignals).
int CachelockRunMain(int argc, char** argv);

}  // namespace dflash

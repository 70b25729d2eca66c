// Whether the spool can hold a frame: its byte budget and its filesystem's free space against one frame of the
// [model] contract. `check` and `run` say so before anything starts; the producers would wait forever or fail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// The bytes of one frame of `model` as a producer writes it (worker/builtin/safetensors.cc, python/dflash_launch/spool/write.py):
/// "hidden" batch x seq_len x taps x hidden x dtype, "tokens" batch x seq_len x 8 (I64), and a header bound.
int64_t SpoolFrameBytes(const ModelSpec& model);

/// The free bytes of the filesystem that holds (or will hold) `dir`: the nearest existing ancestor's statvfs
/// (f_bavail x f_frsize). -1 if none can be read.
int64_t SpoolFreeBytes(const std::string& dir);

/// Warnings when a role produces frames and [model] is given: the budget written ([run] spool_max_bytes) is
/// smaller than one frame, or `free_bytes` of the spool's filesystem (the default budget takes half of it)
/// cannot hold one. Each names where to fix it. `free_bytes` < 0: not known, not checked.
void AddSpoolBudgetWarnings(const RunConfig& config, int64_t free_bytes, std::vector<ConfigError>* warnings);

}  // namespace dflash

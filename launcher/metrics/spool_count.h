// How many hidden-state frames are in each state of a spool, as the spool's transport counts them
// (spool/frame_transport.h; the layout is contract/spool_layout.h's).
#pragma once

#include <cstdint>
#include <string>

namespace dflash {

struct SpoolCounts {
  bool present = false;  ///< the spool's root exists
  int64_t writing = 0;   ///< tmp/: being written by a producer
  int64_t ready = 0;     ///< ready/: published, not claimed yet
  int64_t claimed = 0;   ///< claimed/<consumer>/: held by a consumer, not acknowledged yet
  int64_t pending = 0;   ///< pending/<consumer>/: acknowledged, waiting for the checkpoint that commits it
  int64_t done = 0;      ///< done/: acknowledged after the training step
  int64_t rejected = 0;  ///< rejected/: violated the contract
};

/// Counts the frames under `root` (a missing directory counts 0). Frame files are the names the layout gives
/// frames; the writing state counts every entry, since a frame there has a temporary name.
/// Without `with_done`, done/ is not listed (done stays 0): it only grows (a long run keeps every acknowledged
/// frame there, 100k names take tens of ms to list), so the caller lists it less often.
SpoolCounts CountSpool(const std::string& root, bool with_done = true);

}  // namespace dflash

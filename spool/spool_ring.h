// The ring of reused frame files (dflash_launch/spool/ring.py speaks the same): an acknowledged frame's file goes
// back to its producer (free/) instead of being truncated, and the producer's next frame is written over it, so
// a 100 MB frame costs neither the allocation of its pages nor the truncate that frees them.
//
//   done/<f> (acknowledged, no view left) --RENAME_EXCHANGE with an empty tmp/<f>.tmp--> done/<f> the empty
//            record, tmp/<f>.tmp the bytes --rename--> free/<f>
//   free/<f> (producer p's) --rename, by p under the budget lock--> tmp/<p's next frame>.tmp
//
// done/<f> exists at every instant (the acknowledgement is unchanged); a crash between the two renames leaves
// tmp/<f>.tmp, which the producer's restart and a consumer's start remove. free/ counts against its producer's
// share of the byte budget (SpoolBytes). A finished producer takes nothing back.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "spool/spool.h"

namespace dflash::spool {

/// Frames smaller than this are truncated at their ack, as before the ring: a few pages cost less to allocate and
/// fault in than the ring's renames and scans (the demo's 84 KB frame: 0.6-0.7x the frames/s without the ring; from
/// 0.5 MB on the ring is faster, 2x at 1-2 MB: docs/benchmarks.md). safetensors::MapCache keeps no smaller
/// mapping; dflash_launch/spool/ring.py MIN_BYTES is the same.
inline constexpr int64_t kRingMinBytes = 256 * 1024;

/// False when DFLASH_SPOOL_RING=0: every ack truncates and every frame is a new file, as before the ring (to rule
/// the ring out when a run misbehaves; dflash_launch/spool/ring.py reads the same).
bool RingEnabled();

/// A checkpoint's commit (spool_commit.h) of frame `frame`, still at `pending_path`: its bytes go back to its
/// producer (free/<frame>). REQUIRES: nothing maps it for reading any more. False when not taken (as Recycle): the
/// caller removes it.
bool RecycleCommitted(const SpoolPaths& paths, const std::string& pending_path, const std::string& frame);

/// Hands acknowledged frame done/<f> back to its producer (free/<f>), done/<f> staying as the empty record.
/// REQUIRES: nothing maps it for reading any more. False when it was not taken (a frame under kRingMinBytes, the
/// producer finished, the filesystem cannot exchange names): the caller truncates it.
bool Recycle(const SpoolPaths& paths, const std::string& done_path);

/// [(path, allocated bytes)] of producer `owner`'s files in free/: plain files with one name only.
std::vector<std::pair<std::string, int64_t>> FreeFiles(const SpoolPaths& paths, const std::string& owner);

/// The producer's side: its file `free_path` (one of FreeFiles), renamed to `tmp` and resized to `size` bytes with
/// every page allocated, open for writing at offset 0. An empty fd (the file dropped) if it is gone, not a plain
/// file of ours that nothing else links, or cannot grow: the caller writes a new file then.
UniqueFd OpenFreeFile(const std::string& free_path, const std::string& tmp, uint64_t size);

/// Truncates a plain file with one name to 0 bytes (its pages freed, whoever maps it); never through a link, never
/// blocking on a FIFO; anything else is left as it is.
void EmptyFile(const std::string& path);

/// Truncates `path` to 0 bytes at its open (a frame the ack did not hand to the ring): never through a link,
/// never blocking on a FIFO (it fails there).
void TruncateFile(const std::string& path);

/// EmptyFile, then unlinks: a consumer's kept mapping (safetensors::MapCache) must not keep the pages.
void DropFile(const std::string& path);

/// Drops every file of `owner`'s in free/ (its end).
void DropFree(const SpoolPaths& paths, const std::string& owner);

/// Removes tmp/<f>.tmp where done/<f> exists: a recycle that died between its renames.
void RemoveRingLeftovers(const SpoolPaths& paths);

}  // namespace dflash::spool

// Frames committed with a checkpoint (issue #45, docs/checkpoints.md): a checkpointing consumer acknowledges into
// pending/<consumer>/<position:010d>.<frame>; when the checkpoint covering those positions commits, they move to
// done/<frame>, which then holds the one-line record {"checkpoint": "<path>"}. The same names, record bytes and
// errors as dflash_launch/spool_dirs.py (pending_name, parse_pending, commit_pending): one spool, either language.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "spool/spool.h"

namespace dflash::spool {

/// "<position as 10 digits>.<frame>": names that sort in the order the consumer stepped on the frames, and its
/// inverse (contract/spool_layout.h).
using layout::PendingName;
using layout::ParsePendingName;

struct PendingFrame {
  int64_t position = 0;
  std::string frame, path;
};
/// `consumer`'s pending frames, in position order (none if it has no pending/ directory).
bool PendingFramesOf(const SpoolPaths& paths, const std::string& consumer, std::vector<PendingFrame>* out,
                     std::string* err);

/// The record a commit writes into done/<frame>, byte for byte as Python's json.dumps writes it.
std::string CommitRecord(const std::string& checkpoint);

/// The checkpoint a done/ frame's record names; `*has` false for a frame acknowledged without one (empty file) or
/// a record that cannot be read.
void CommittedBy(const std::string& done_file, std::string* checkpoint, bool* has);

/// The frames done/ holds committed by a checkpoint directly inside `checkpoint_dir` (one process's; the
/// record's path minus its last component is that dir, as written): checkpoint path -> its frames, sorted. What a
/// restore checks before it trusts the checkpoint it picked to cover every committed frame.
bool CommitsInto(const SpoolPaths& paths, const std::string& checkpoint_dir,
                 std::map<std::string, std::vector<std::string>>* out, std::string* err);

/// The commit of a checkpoint on the spool: every frame a consumer acknowledged before its position in the
/// checkpoint (`positions`: consumer -> position) moves pending/ -> done/ (a new file holding CommitRecord; the
/// pending file is unlinked, never truncated: a consumer may still map it). Idempotent: a restore repeats it for
/// the checkpoint it restores, so a kill between the checkpoint's rename and these moves loses nothing. A frame
/// done/ already has from another checkpoint (or none) was committed twice: an error, never silent.
/// `*committed`: how many frames it moved.
/// `may_drop`: where it says false, the pending file is only unlinked (no ring, no truncate: a view maps it).
bool CommitPending(const SpoolPaths& paths, const std::map<std::string, int64_t>& positions,
                   const std::string& checkpoint, int* committed, std::string* err, const MayDrop* may_drop = nullptr);

}  // namespace dflash::spool

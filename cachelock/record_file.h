// A small record file rewritten in place: the holder's "who am I" beside each lock level.
#pragma once

#include <string>

#include "common/fd.h"

namespace dflash {

/// One record slot in a file that stays open for the gate's lifetime. Writes
/// are a single pwrite() of a fixed-size, space-padded slot, so a longer old
/// record never leaves a tail behind and no temp files pile up (a holder may
/// be SIGKILLed at any instruction). Not fsynced: the record only says who
/// holds a lock right now, and after a reboot nobody does. A lock-free reader
/// may see a write half done; DecodeOwner reports that as kGarbled.
class RecordFile {
 public:
  static constexpr size_t kSlotSize = 1024;

  RecordFile() = default;
  RecordFile(RecordFile&&) = default;
  RecordFile& operator=(RecordFile&&) = default;
  ~RecordFile();

  /// Opens or creates `path` 0600, O_CLOEXEC|O_NOFOLLOW, and refuses a file
  /// owned by another user (in /dev/shm anyone may create a name first).
  bool Open(const std::string& path, std::string* err);

  /// REQUIRES: text.size() < kSlotSize (records are small; longer is refused).
  bool Write(const std::string& text, std::string* err);
  /// Blanks the slot (all spaces): DecodeOwner reads that as kEmpty.
  void Clear();
  std::string Read() const;
  const std::string& path() const { return path_; }

 private:
  UniqueFd fd_;
  std::string path_;
};

}  // namespace dflash

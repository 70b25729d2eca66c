// The mappings of the spool ring's files (spool_ring.h) a consumer keeps after their frames: a frame written over
// a file this process has mapped is read through the same page tables, without a page fault per 4 KiB page (at
// 100 MB about a memcpy on a VM) nor the munmap. dflash_launch/spool/mapped.py MapCache does the same.
//
// A MAP_PRIVATE mapping shows the file's pages as the producer rewrites them, except the pages a write through
// it copied for this process: Put drops those (MADV_DONTNEED of the pages /proc/self/pagemap says are private
// copies), so a later frame is read from the file, never from a copy of an earlier one; where pagemap cannot be
// read the mapping is unmapped instead. Keyed by (st_dev, st_ino): a kept mapping holds its file, so the number
// is not reused while it is kept.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <list>
#include <mutex>

namespace dflash::safetensors {

class MapCache {
 public:
  /// At most `limit` mappings, none under `min_bytes` (spool::kRingMinBytes: smaller frames' files are not reused).
  explicit MapCache(size_t limit = 64, size_t min_bytes = 256 * 1024) : limit_(limit), min_bytes_(min_bytes) {}
  ~MapCache();
  MapCache(const MapCache&) = delete;
  MapCache& operator=(const MapCache&) = delete;

  /// The kept mapping of the file `st` describes if it maps exactly st.st_size bytes (then no longer kept);
  /// nullptr otherwise.
  void* Take(const struct stat& st);
  /// Keeps mapping `p` (`size` bytes of file dev/ino), its private pages dropped; unmaps it where it cannot.
  /// REQUIRES: nothing reads it any more. The oldest beyond the limit are unmapped.
  void Put(dev_t dev, ino_t ino, void* p, size_t size);

  int hits() const { return hits_; }
  int misses() const { return misses_; }

 private:
  struct Entry {
    dev_t dev;
    ino_t ino;
    void* p;
    size_t size;
  };
  bool DropPrivatePages(void* p, size_t size);

  std::mutex mu_;
  size_t limit_, min_bytes_;
  std::list<Entry> kept_;  // oldest first
  int pagemap_ = -1;
  int hits_ = 0, misses_ = 0;
};

}  // namespace dflash::safetensors

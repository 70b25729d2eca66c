#include "spool/map_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace dflash::safetensors {

MapCache::~MapCache() {
  for (const Entry& e : kept_) ::munmap(e.p, e.size);
  if (pagemap_ >= 0) ::close(pagemap_);
}

void* MapCache::Take(const struct stat& st) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->dev != st.st_dev || it->ino != st.st_ino) continue;
    Entry e = *it;
    kept_.erase(it);
    if (e.size == static_cast<size_t>(st.st_size)) {
      ++hits_;
      return e.p;
    }
    ::munmap(e.p, e.size);
    break;
  }
  ++misses_;
  return nullptr;
}

void MapCache::Put(dev_t dev, ino_t ino, void* p, size_t size) {
  std::lock_guard<std::mutex> l(mu_);
  if (limit_ == 0 || size < min_bytes_ || !DropPrivatePages(p, size)) {
    ::munmap(p, size);
    return;
  }
  kept_.push_back({dev, ino, p, size});
  while (kept_.size() > limit_) {
    ::munmap(kept_.front().p, kept_.front().size);
    kept_.pop_front();
  }
}

bool MapCache::DropPrivatePages(void* p, size_t size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (pagemap_ < 0) pagemap_ = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pagemap_ < 0) return false;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page;
  const size_t n = (size + page - 1) / page;
  std::vector<uint64_t> e(n);
  const ssize_t want = static_cast<ssize_t>(n * sizeof(uint64_t));
  if (::pread(pagemap_, e.data(), want, static_cast<off_t>(first * sizeof(uint64_t))) != want) return false;
  // Bit 63: present, 62: swapped, 61: a file (page cache) page. Present and not the file's, or swapped: a copy
  // this process made.
  auto is_private = [](uint64_t v) { return ((v >> 63 & 1) && !(v >> 61 & 1)) || (v >> 62 & 1); };
  for (size_t i = 0; i < n;) {
    if (!is_private(e[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && is_private(e[j])) ++j;
    if (::madvise(static_cast<char*>(p) + i * page, (j - i) * page, MADV_DONTNEED) != 0) return false;
    i = j;
  }
  return true;
}

}  // namespace dflash::safetensors

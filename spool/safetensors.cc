#include "spool/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "spool/map_cache.h"

namespace dflash::safetensors {
namespace {

// What the Rust reader accepts at most (safetensors::tensor::MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeader = 100'000'000;

bool ShapeBytes(const std::string& dtype, const std::vector<int64_t>& shape, uint64_t* bytes, std::string* err) {
  size_t es = DTypeSize(dtype);
  if (!es) {
    *err = "unknown dtype " + dtype;
    return false;
  }
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      *err = "negative dimension";
      return false;
    }
    n *= static_cast<uint64_t>(d);
  }
  *bytes = n * es;
  return true;
}

}  // namespace

const TensorEntry* Header::Find(std::string_view name) const {
  for (const TensorEntry& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t DTypeSize(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

bool EncodeHeader(const Metadata& metadata, const std::vector<TensorRef>& tensors, std::string* out,
                  std::string* err) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const TensorRef& t : tensors) {
    uint64_t want = 0;
    if (!ShapeBytes(t.dtype, t.shape, &want, err)) {
      *err = t.name + ": " + *err;
      return false;
    }
    if (want != t.nbytes) {
      *err = t.name + ": " + std::to_string(t.nbytes) + " bytes given, dtype x shape needs " + std::to_string(want);
      return false;
    }
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-aligned
  uint64_t n = text.size();
  out->resize(8);
  for (int i = 0; i < 8; ++i) (*out)[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out->append(text);
  return true;
}

bool ParseHeader(std::string_view prefix, uint64_t file_size, Header* out, std::string* err) {
  if (prefix.size() < 8) {
    *err = "not a safetensors file: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length";
    return false;
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(prefix[static_cast<size_t>(i)])) << (8 * i);
  if (n > kMaxHeader || 8 + n > file_size || 8 + n > prefix.size()) {
    *err = "not a safetensors file: header length " + std::to_string(n) + " does not fit in " +
           std::to_string(file_size) + " bytes";
    return false;
  }
  nlohmann::json j = nlohmann::json::parse(prefix.substr(8, n), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    // What it is instead, in the words Python's json names it (a quarantined frame's reason says it).
    const std::string kind = j.is_array() ? "a list" : j.is_string() ? "a string" : j.is_null() ? "null"
                             : j.is_boolean() ? "a boolean" : "a number";
    *err = j.is_discarded() ? "not a safetensors file: the header is not JSON"
                            : "not a safetensors file: the header is " + kind + ", not a JSON object";
    return false;
  }
  Header h;
  h.data_offset = 8 + n;
  const uint64_t data_size = file_size - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) {
        *err = "__metadata__ is not an object";
        return false;
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          *err = "__metadata__." + m.key() + " is not a string";
          return false;
        }
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorEntry t;
    t.name = it.key();
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      *err = "tensor " + t.name + ": needs dtype, shape and data_offsets";
      return false;
    }
    t.dtype = v["dtype"].get<std::string>();
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer()) {
        *err = "tensor " + t.name + ": shape is not integers";
        return false;
      }
      t.shape.push_back(d.get<int64_t>());
    }
    if (!v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned()) {
      *err = "tensor " + t.name + ": data_offsets are not integers";
      return false;
    }
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    uint64_t want = 0;
    if (!ShapeBytes(t.dtype, t.shape, &want, err)) {
      *err = "tensor " + t.name + ": " + *err;
      return false;
    }
    if (t.end < t.begin || t.end - t.begin != want || t.end > data_size) {
      *err = "tensor " + t.name + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] do not hold dtype x shape = " + std::to_string(want) + " bytes inside " + std::to_string(data_size);
      return false;
    }
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const TensorEntry& t : h.tensors) {
    if (t.begin != at) {
      *err = "tensor " + t.name + ": the data section has a hole or an overlap at byte " + std::to_string(at);
      return false;
    }
    at = t.end;
  }
  if (at != data_size) {
    *err = "the data section holds " + std::to_string(data_size) + " bytes, the tensors " + std::to_string(at);
    return false;
  }
  *out = std::move(h);
  return true;
}

bool WriteFd(int fd, const Metadata& metadata, const std::vector<TensorRef>& tensors, std::string* err) {
  std::string head;
  if (!EncodeHeader(metadata, tensors, &head, err)) return false;
  std::vector<iovec> iov;
  iov.push_back({head.data(), head.size()});
  for (const TensorRef& t : tensors)
    if (t.nbytes) iov.push_back({const_cast<void*>(t.data), t.nbytes});
  size_t i = 0;
  while (i < iov.size()) {
    int cnt = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    ssize_t n = ::writev(fd, &iov[i], cnt);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = ErrnoMessage("writev", errno);
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left) {  // a short write inside iov[i]
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return true;
}

bool EncodedSize(const Metadata& metadata, const std::vector<TensorRef>& tensors, uint64_t* size, std::string* err) {
  std::string head;
  if (!EncodeHeader(metadata, tensors, &head, err)) return false;
  *size = head.size();
  for (const TensorRef& t : tensors) *size += t.nbytes;
  return true;
}

bool WriteFile(const std::string& path, const Metadata& metadata, const std::vector<TensorRef>& tensors,
               std::string* err, bool exclusive, int* err_no) {
  if (err_no) *err_no = 0;
  uint64_t size = 0;
  if (!EncodedSize(metadata, tensors, &size, err)) return false;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0600));
  if (!fd) {
    if (err_no) *err_no = errno;
    *err = ErrnoMessage("open(" + path + ")", errno);
    return false;
  }
  // Every page claimed before the first byte: a full tmpfs fails here, not
  // after half a frame. Filesystems without fallocate just write.
  int e = size ? ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)) : 0;
  if (e && e != EOPNOTSUPP && e != EINVAL) {
    if (err_no) *err_no = e;
    *err = path + ": " + ErrnoMessage("posix_fallocate(" + std::to_string(size) + " bytes)", e);
    ::unlink(path.c_str());
    return false;
  }
  if (!WriteFd(fd.get(), metadata, tensors, err)) {
    if (err_no) *err_no = errno;
    *err = path + ": " + *err;
    ::unlink(path.c_str());
    return false;
  }
  return true;
}

bool File::Read(const std::string& path, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    *err = ErrnoMessage("open(" + path + ")", errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *err = ErrnoMessage("fstat(" + path + ")", errno);
    return false;
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* p = std::aligned_alloc(64, std::max<size_t>(64, (size + 63) / 64 * 64));
  if (!p) {
    *err = path + ": out of memory for " + std::to_string(size) + " bytes";
    return false;
  }
  std::shared_ptr<uint8_t> buf(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(fd.get(), buf.get() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = ErrnoMessage("read(" + path + ")", errno);
      return false;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != size) {
    *err = path + ": shrank while being read (" + std::to_string(got) + " of " + std::to_string(size) + " bytes)";
    return false;
  }
  Header h;
  if (!ParseHeader(std::string_view(reinterpret_cast<const char*>(buf.get()), size), size, &h, err)) {
    *err = path + ": " + *err;
    return false;
  }
  buf_ = std::move(buf);
  size_ = size;
  header_ = std::move(h);
  return true;
}

bool File::Map(const std::string& path, std::string* err, std::shared_ptr<MapCache> cache) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    *err = ErrnoMessage("open(" + path + ")", errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *err = ErrnoMessage("fstat(" + path + ")", errno);
    return false;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  Header h;
  if (size < 8) {  // nothing to map (mmap of 0 bytes is EINVAL): the header check says what is wrong
    ParseHeader(std::string_view(), size, &h, err);
    *err = path + ": " + *err;
    return false;
  }
  // PROT_WRITE on a read-only fd is allowed for MAP_PRIVATE: writes copy the page, the file never changes.
  void* p = cache ? cache->Take(st) : nullptr;
  if (!p) p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED) {
    *err = ErrnoMessage("mmap(" + path + ")", errno);
    return false;
  }
  std::weak_ptr<MapCache> keep = cache;
  auto unmap = [size, keep, dev = st.st_dev, ino = st.st_ino](uint8_t* q) {
    if (auto c = keep.lock()) c->Put(dev, ino, q, size);  // kept for a later frame over the file
    else ::munmap(q, size);
  };
  std::shared_ptr<uint8_t> buf(static_cast<uint8_t*>(p), unmap);
  if (!ParseHeader(std::string_view(reinterpret_cast<const char*>(buf.get()), size), size, &h, err)) {
    *err = path + ": " + *err;
    return false;
  }
  buf_ = std::move(buf);
  size_ = size;
  header_ = std::move(h);
  return true;
}

}  // namespace dflash::safetensors

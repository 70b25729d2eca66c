// The safetensors file format, both ways, without LibTorch: an 8-byte
// little-endian header length N, N bytes of JSON ({"__metadata__": {str: str},
// "<name>": {"dtype", "shape", "data_offsets": [begin, end]}}, padded with
// spaces to a multiple of 8), then the raw little-endian tensor bytes.
// Python reads these files with the `safetensors` package (safe_open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dflash::safetensors {

class MapCache;  // map_cache.h
using Metadata = std::map<std::string, std::string>;

/// One tensor to write: bytes owned by the caller until Write returns.
struct TensorRef {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "I64", "I32", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// One tensor of a parsed header: offsets are into the data section.
struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  Metadata metadata;
  std::vector<TensorEntry> tensors;  // in data order
  uint64_t data_offset = 0;          // 8 + header length: where the data section starts

  const TensorEntry* Find(std::string_view name) const;
};

/// Bytes per element of a safetensors dtype; 0 if unknown.
size_t DTypeSize(std::string_view dtype);

/// The 8-byte length and the padded JSON header for `tensors` laid out in order.
/// False (with `err`) if a tensor's byte count does not match dtype x shape.
bool EncodeHeader(const Metadata& metadata, const std::vector<TensorRef>& tensors, std::string* out,
                  std::string* err);

/// Parses the header of a file whose first bytes are `prefix` (the whole
/// file, or at least 8 + N bytes) of a file of `file_size` bytes. Checks what
/// the Rust reader checks: offsets in order, contiguous, inside the file,
/// sized dtype x shape.
bool ParseHeader(std::string_view prefix, uint64_t file_size, Header* out, std::string* err);

/// Writes header + tensors to an open fd with one writev per batch of buffers.
bool WriteFd(int fd, const Metadata& metadata, const std::vector<TensorRef>& tensors, std::string* err);

/// Creates (O_EXCL) and writes `path`, its pages allocated first
/// (posix_fallocate: a filesystem that cannot hold it fails before a byte is
/// written). Not atomic: callers publish by rename. `*err_no`: the errno of a
/// failure (ENOSPC: the filesystem is full); a failed file is removed.
bool WriteFile(const std::string& path, const Metadata& metadata, const std::vector<TensorRef>& tensors,
               std::string* err, bool exclusive = true, int* err_no = nullptr);

/// The bytes of the file WriteFd would write: header + tensors.
bool EncodedSize(const Metadata& metadata, const std::vector<TensorRef>& tensors, uint64_t* size, std::string* err);

/// A whole file, its header parsed: read into one 64-byte-aligned buffer
/// (Read), or mapped copy-on-write (Map). The data of tensor t is Data(t):
/// valid as long as the File or a holder of buffer() lives.
class File {
 public:
  bool Read(const std::string& path, std::string* err);
  /// mmap(MAP_PRIVATE, PROT_READ | PROT_WRITE) of the whole file: no copy,
  /// pages come from the page cache as they are touched, and a write to a
  /// view copies that page without touching the file. The mapping goes when
  /// the last holder of buffer() does; the file must not shrink before that
  /// (a touched page past its end is SIGBUS): drop every view, then truncate.
  /// With `cache` the mapping the file had before is reused, and handed back to it when the last holder goes.
  bool Map(const std::string& path, std::string* err, std::shared_ptr<MapCache> cache = nullptr);
  const Header& header() const { return header_; }
  const uint8_t* Data(const TensorEntry& t) const { return buf_.get() + header_.data_offset + t.begin; }
  size_t size() const { return size_; }
  /// Hands the buffer to someone who outlives this File (a tensor deleter).
  std::shared_ptr<uint8_t> buffer() const { return buf_; }

 private:
  std::shared_ptr<uint8_t> buf_;
  size_t size_ = 0;
  Header header_;
};

}  // namespace dflash::safetensors

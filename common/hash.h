// Content hashes (SHA-256 via OpenSSL) for gate keys and cache manifests.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dflash {

/// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

/// SHA-256 fed in pieces: for content streamed through a fixed buffer.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  /// Lower-case hex of everything fed so far (call once).
  std::string Hex();

 private:
  void* ctx_;
};

/// Lower-case hex SHA-256 of a file's content; false with `err` if unreadable.
bool Sha256File(const std::string& path, std::string* hex, std::string* err);

}  // namespace dflash

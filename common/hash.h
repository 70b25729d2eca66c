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

/// Lower-case hex HMAC-SHA256 of `data` under `key`: what the cluster gate signs its archives with.
std::string HmacSha256Hex(std::string_view key, std::string_view data);
/// Compares two strings in time that depends only on their lengths (signatures, passwords).
bool ConstantTimeEqual(std::string_view a, std::string_view b);

/// Lower-case hex SHA-256 of a file's content; false with `err` if unreadable.
bool Sha256File(const std::string& path, std::string* hex, std::string* err);

}  // namespace dflash

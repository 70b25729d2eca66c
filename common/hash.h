// Content hashes (SHA-256 via OpenSSL) for gate keys and cache manifests.
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

/// Lower-case hex SHA-256 of a file's content; false with `err` if unreadable.
bool Sha256File(const std::string& path, std::string* hex, std::string* err);

}  // namespace dflash

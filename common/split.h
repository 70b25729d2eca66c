// One way to cut a string at a separator, for the lists the launcher reads (CUDA_VISIBLE_DEVICES, PATH, a
// cache path's components).
#pragma once

#include <string>
#include <vector>

namespace dflash {

/// `s` cut at every `sep`, empty pieces kept: "a,,b" -> {"a", "", "b"}; "" -> {""}.
inline std::vector<std::string> SplitOn(const std::string& s, char sep) {
  std::vector<std::string> out;
  for (size_t at = 0;;) {
    size_t end = s.find(sep, at);
    out.push_back(s.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) return out;
    at = end + 1;
  }
}

}  // namespace dflash

#include "testing/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "common/fd.h"

namespace dflash::test {

std::string Slurp(const std::string& path) {
  std::string text, err;
  if (!ReadFile(path, &text, &err)) {
    ADD_FAILURE() << "cannot read " << path << ": " << err;
    return "";
  }
  return text;
}

std::string ReadToEof(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

void WriteText(const std::string& path, std::string_view text) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) ADD_FAILURE() << "cannot write " << path;
}

}  // namespace dflash::test

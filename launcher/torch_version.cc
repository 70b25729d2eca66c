#include "launcher/torch_version.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>

#ifndef DFLASH_LIBTORCH_VERSION
#define DFLASH_LIBTORCH_VERSION "none"
#endif

namespace dflash {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string AskPython(const std::string& python) {
  std::string cmd = ShellQuote(python) +
                    " -c 'import importlib.metadata as m\ntry: print(m.version(\"torch\"))\nexcept Exception: "
                    "print(\"none\")' 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "re");  // "e": the pipe is O_CLOEXEC
  if (!f) return "unknown";
  char buf[128] = {0};
  std::string out = std::fgets(buf, sizeof buf, f) ? buf : "";
  int rc = ::pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return rc == 0 && !out.empty() ? out : "unknown";
}

}  // namespace

std::string BuiltinTorchVersion() { return DFLASH_LIBTORCH_VERSION; }

std::string TorchVersionFor(const RoleSpec& role) {
  if (!role.builtin.empty()) return BuiltinTorchVersion();
  std::string python = "python3";
  if (!role.command.empty()) {
    std::string base = std::filesystem::path(role.command[0]).filename().string();
    if (base.rfind("python", 0) == 0) python = role.command[0];
  }
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(python);
  if (it != cache.end()) return it->second;
  return cache[python] = AskPython(python);
}

}  // namespace dflash

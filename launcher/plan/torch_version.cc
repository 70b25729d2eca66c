#include "launcher/plan/torch_version.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/fd.h"
#include "common/spawn.h"

#ifndef DFLASH_LIBTORCH_VERSION
#define DFLASH_LIBTORCH_VERSION "none"
#endif

namespace dflash {
namespace {

/// importlib.metadata reads the installed distribution's metadata: no torch import.
constexpr const char* kProbe =
    "import importlib.metadata as m\n"
    "try: print(m.version('torch'))\n"
    "except Exception: print('none')\n";
/// The CUDA runtime torch was built for (torch/version.py's `cuda`, read as text: importing torch
/// would cost seconds and touch the driver) and Triton's version, without importing either.
constexpr const char* kRuntimeProbe =
    "import importlib.metadata as m, importlib.util as u, os, re\n"
    "cuda = 'none'\n"
    "try:\n"
    "    s = u.find_spec('torch')\n"
    "    t = open(os.path.join(list(s.submodule_search_locations)[0], 'version.py')).read()\n"
    "    g = re.search(r'^cuda\\b[^=]*=\\s*[\\x27\\x22]([^\\x27\\x22]+)', t, re.M)\n"
    "    cuda = g.group(1) if g else 'none'\n"
    "except Exception: pass\n"
    "triton = 'none'\n"
    "for d in ('triton', 'pytorch-triton'):\n"
    "    try: triton = m.version(d); break\n"
    "    except Exception: pass\n"
    "print('cuda ' + cuda + ' triton ' + triton)\n";
/// A python that does not answer in this long is not going to (a broken site-packages, an NFS hang).
constexpr auto kProbeTimeout = std::chrono::seconds(30);

}  // namespace

std::string AskPythonForTorchVersion(const std::string& python, const std::vector<std::string>& env,
                                     const std::string& cwd, Millis timeout) {
  return AskPython(python, kProbe, env, cwd, timeout);
}

std::string AskPython(const std::string& python, const char* script, const std::vector<std::string>& env,
                      const std::string& cwd, Millis timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return "unknown";
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  SpawnOptions so;
  so.argv = {python, "-c", script};
  so.env = env;
  so.cwd = cwd;
  so.stdout_fd = write_end.get();
  so.stderr_fd = kDevNullFd;
  so.group = SpawnOptions::Group::kNewProcessGroup;
  so.death_signal = SIGKILL;
  Child child;
  std::string err;
  bool started = Spawn(so, &child, &err);
  write_end.reset();  // EOF once the probe (and anything it started) closed stdout
  if (child.pid <= 0) return "unknown";  // not found in the role's PATH: nothing was forked
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  while (started && out.size() < 4096) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{read_end.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // the deadline is checked above
    char buf[512];
    ssize_t r = ::read(read_end.get(), buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  if (timed_out) ::kill(-child.pid, SIGKILL);
  ExitStatus st;
  WaitForChild(child.pid, &st, &err);  // we forked it: we reap it (also after a failed exec)
  if (timed_out || !started || !st.exited || st.code != 0) return "unknown";
  out = out.substr(0, out.find('\n'));
  while (!out.empty() && (out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string BuiltinTorchVersion() { return DFLASH_LIBTORCH_VERSION; }

namespace {

/// Asks the role's Python (see TorchVersionFor) `script`, once per (script, python, PATH, cwd), with
/// `extra` on top of the role's environment.
std::string AskRolePython(const RoleSpec& role, const char* script,
                          const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  std::string python = "python3";
  if (!role.command.empty()) {
    std::string base = std::filesystem::path(role.command[0]).filename().string();
    if (base.rfind("python", 0) == 0) python = role.command[0];
  }
  // The role's processes get the launcher's environment with the role's env on top.
  std::vector<std::string> env = CurrentEnvironment();
  for (const auto& [k, v] : role.env) SetEnvVar(&env, k, v);
  for (const auto& [k, v] : extra) SetEnvVar(&env, k, v);
  std::string path(GetEnvVar(env, "PATH").value_or(""));
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::string key = std::string(script) + '\0' + python + '\0' + path + '\0' + role.cwd;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = AskPython(python, script, env, role.cwd, kProbeTimeout);
}

}  // namespace

std::string TorchVersionFor(const RoleSpec& role) {
  if (!role.builtin.empty()) return BuiltinTorchVersion();
  return AskRolePython(role, kProbe);
}

std::string CudaRuntimeFor(const RoleSpec& role) {
  // dflash-builtin runs the LibTorch it was built with: its version names its CUDA (2.13.0+cu130).
  if (!role.builtin.empty()) return "libtorch " + BuiltinTorchVersion();
  return AskRolePython(role, kRuntimeProbe);
}

}  // namespace dflash

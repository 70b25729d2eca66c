#include "launcher/plan/gate_key_files.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/fd.h"
#include "common/hash.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string EnvValue(const RoleSpec& role, const Env& launcher_env, const std::string& name) {
  for (const auto& [k, v] : role.env)
    if (k == name) return v;
  for (const auto& [k, v] : launcher_env)
    if (k == name) return v;
  return "";
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    size_t end = s.find(sep, at);
    out.push_back(s.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) return out;
    at = end + 1;
  }
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string Absolute(const std::string& path, const std::string& cwd) {
  if (path.empty() || path[0] == '/') return path;
  return (fs::path(cwd.empty() ? fs::current_path().string() : cwd) / path).lexically_normal().string();
}

KeyFile Hashed(std::string why, const std::string& path) {
  KeyFile f{std::move(why), path, "", ""};
  std::string content, err;
  if (path.empty()) f.note = "not found";
  else if (!ReadFile(path, &content, &err)) f.note = "unreadable: " + err;
  else f.sha256 = Sha256Hex(content);
  return f;
}

/// `python -m a.b`: a/b.py or a/b/__main__.py under the role's cwd, then each
/// PYTHONPATH entry -- sys.path's order before site-packages.
std::string FindModuleNearby(const std::string& module, const std::string& cwd, const std::string& pythonpath) {
  std::string rel = module;
  for (char& c : rel)
    if (c == '.') c = '/';
  std::vector<std::string> dirs = {cwd.empty() ? fs::current_path().string() : cwd};
  if (!pythonpath.empty())
    for (const std::string& d : Split(pythonpath, ':'))
      if (!d.empty()) dirs.push_back(Absolute(d, cwd));
  for (const std::string& d : dirs) {
    for (const std::string& cand : {d + "/" + rel + ".py", d + "/" + rel + "/__main__.py"})
      if (IsRegularFile(cand)) return cand;
  }
  return "";
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// An installed module (site-packages, an editable install): ask the role's
/// Python where it is, from the role's cwd and with its PYTHONPATH.
std::string AskPythonForModule(const std::string& python, const std::string& module, const std::string& cwd,
                               const std::string& pythonpath) {
  std::string cmd = (cwd.empty() ? "" : "cd " + ShellQuote(cwd) + " && ") +
                    (pythonpath.empty() ? "" : "PYTHONPATH=" + ShellQuote(pythonpath) + " ") + ShellQuote(python) +
                    " -c 'import importlib.util,sys\ns=importlib.util.find_spec(sys.argv[1])\n"
                    "o=s and s.origin\nif s and s.submodule_search_locations:\n"
                    " m=importlib.util.find_spec(sys.argv[1]+\".__main__\");o=m and m.origin\nprint(o or \"\")' " +
                    ShellQuote(module) + " 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "re");
  if (!f) return "";
  char buf[4096] = {0};
  std::string out = std::fgets(buf, sizeof buf, f) ? buf : "";
  ::pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return IsRegularFile(out) ? out : "";
}

/// The program `name` as the role's PATH finds it.
std::string Which(const std::string& name, const std::string& path_env, const std::string& cwd) {
  if (name.find('/') != std::string::npos) return Absolute(name, cwd);
  for (const std::string& d : Split(path_env, ':')) {
    std::string cand = (d.empty() ? "." : d) + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0 && IsRegularFile(cand)) return cand;
  }
  return "";
}

bool IsPython(const std::string& program) {
  std::string base = fs::path(program).filename().string();
  return base.rfind("python", 0) == 0;
}

bool StartsWithShebang(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return false;
  char two[2] = {0, 0};
  size_t n = std::fread(two, 1, 2, f);
  std::fclose(f);
  return n == 2 && two[0] == '#' && two[1] == '!';
}

/// The script of a python command line: the first argument that is not an
/// interpreter option (options with a value: -m -c -W -X --check-hash-based-pycs).
void PythonScript(const RoleSpec& role, const Env& launcher_env, std::vector<KeyFile>* out) {
  const std::vector<std::string>& cmd = role.command;
  const std::string pythonpath = EnvValue(role, launcher_env, "PYTHONPATH");
  for (size_t i = 1; i < cmd.size(); ++i) {
    const std::string& a = cmd[i];
    if (a == "-c") return;  // the code is on the command line: the key has it already
    if (a == "-m" && i + 1 < cmd.size()) {
      const std::string& mod = cmd[i + 1];
      std::string found = FindModuleNearby(mod, role.cwd, pythonpath);
      if (found.empty()) found = AskPythonForModule(cmd[0], mod, role.cwd, pythonpath);
      out->push_back(Hashed("module " + mod, found));
      return;
    }
    if (a.rfind("-m", 0) == 0 && a.size() > 2) {  // -mpkg.mod
      std::string mod = a.substr(2);
      std::string found = FindModuleNearby(mod, role.cwd, pythonpath);
      if (found.empty()) found = AskPythonForModule(cmd[0], mod, role.cwd, pythonpath);
      out->push_back(Hashed("module " + mod, found));
      return;
    }
    if (a == "-W" || a == "-X" || a == "--check-hash-based-pycs") {
      ++i;
      continue;
    }
    if (a == "-" ) return;  // stdin
    if (!a.empty() && a[0] == '-') continue;  // -u, -O, -B, -I, -E, -s, -S, -q, -OO, -bb ...
    std::string path = Absolute(a, role.cwd);
    out->push_back(Hashed("script " + a, IsRegularFile(path) ? path : ""));
    return;
  }
}

}  // namespace

std::vector<KeyFile> CollectKeyFiles(const RoleSpec& role, const Env& launcher_env) {
  std::vector<KeyFile> out;
  if (role.builtin.empty() && !role.command.empty()) {
    if (IsPython(role.command[0])) {
      PythonScript(role, launcher_env, &out);
    } else {
      // A script run directly (./train.sh, train.py with a #! line): its text.
      // A compiled program is left to the command line (and key_files).
      std::string prog = Which(role.command[0], EnvValue(role, launcher_env, "PATH"), role.cwd);
      if (!prog.empty() && StartsWithShebang(prog)) out.push_back(Hashed("script " + role.command[0], prog));
    }
  }
  for (const std::string& pattern : role.gate.key_files) {
    std::string abs = Absolute(pattern, role.cwd);
    glob_t g{};
    int rc = ::glob(abs.c_str(), 0, nullptr, &g);  // sorted (no GLOB_NOSORT): a stable key
    if (rc != 0 || g.gl_pathc == 0) {
      out.push_back({"key_files " + pattern, "", "", "matches no file"});
    } else {
      for (size_t i = 0; i < g.gl_pathc; ++i)
        if (IsRegularFile(g.gl_pathv[i])) out.push_back(Hashed("key_files " + pattern, g.gl_pathv[i]));
    }
    ::globfree(&g);
  }
  return out;
}

}  // namespace dflash

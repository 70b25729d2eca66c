#include "launcher/plan/gate_key_files.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/fd.h"
#include "common/hash.h"
#include "common/split.h"

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
    for (const std::string& d : SplitOn(pythonpath, ':'))
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
  for (const std::string& d : SplitOn(path_env, ':')) {
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

/// The modules a Python file imports, followed transitively, that live outside
/// the interpreter's own install (stdlib, site-packages: their versions are the
/// install's business): the model code a drafter script imports from its
/// siblings, which Dynamo traces as much as the script. Static (the stdlib's
/// modulefinder, pruned at the install so torch's thousand modules are not read):
/// it sees `import x` and `from x import y`, not importlib.import_module(name) or
/// exec -- those go in gate.key_files. A namespace package (a folder without
/// __init__.py) is followed into: modulefinder alone stops there. One line
/// "<module>\t<path>" per module; a line "!\t<error>\t<file>" if the sources
/// could not be followed (e.g. a SyntaxError in <file>).
constexpr const char* kImportProbe = R"PY(import modulefinder, os, site, sys, sysconfig
path, as_module = sys.argv[1], sys.argv[2] == "1"
sys.path[0] = os.getcwd() if as_module else os.path.dirname(os.path.abspath(path))
inst = {os.path.realpath(p) for p in sysconfig.get_paths().values() if p}
inst |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
try: inst |= {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
except Exception: pass
def own(p):
    r = os.path.realpath(p)
    return not any(r == i or r.startswith(i + os.sep) for i in inst)
import importlib.machinery
NS = -47  # modulefinder's own kinds are small positive numbers
class Finder(modulefinder.ModuleFinder):
    def find_module(self, name, path, parent=None):
        # A namespace package (a folder without __init__.py): modulefinder asks its spec's loader, which is None.
        full = parent.__name__ + "." + name if parent else name
        if full not in self.excludes and not (path is None and name in sys.builtin_module_names):
            try: spec = importlib.machinery.PathFinder.find_spec(name, self.path if path is None else path)
            except Exception: spec = None
            if spec is not None and spec.loader is None and spec.submodule_search_locations:
                return None, list(spec.submodule_search_locations), ("", "", NS)
        return super().find_module(name, path, parent)
    def load_module(self, name, fp, pathname, info):
        if isinstance(pathname, str): self._dflash_reading = pathname
        if info[2] == NS:
            m = self.add_module(name); m.__path__ = pathname
            return m
        if pathname and not own(pathname):
            m = self.add_module(name); m.__file__ = pathname
            if info[2] == modulefinder._PKG_DIRECTORY: m.__path__ = [pathname]
            return m
        try: return super().load_module(name, fp, pathname, info)
        except SyntaxError as e:  # modulefinder drops it silently (a bad module): say it
            if not getattr(e, "dflash_said", False):  # once, where it is: not again in each importer
                e.dflash_said = True; unread.append("%s: SyntaxError at line %s\t%s" % (name, e.lineno, pathname))
            raise
def locate(name):
    """The own file (or folder) that `import name` would read, or None (not there, or the install's)."""
    spec, where = None, None
    for part in name.split("."):
        try: spec = importlib.machinery.PathFinder.find_spec(part, f.path if where is None else where)
        except Exception: return None
        if spec is None: return None
        where = spec.submodule_search_locations
        if where is None and part != name.split(".")[-1]: return None
    o = spec.origin if spec.origin and os.path.isfile(spec.origin) else (list(where)[0] if where else None)
    return o if o and own(o) else None
unread = []
f = Finder()
try:
    f.run_script(path)
    # A top-level name modulefinder's path search missed may be an editable install served by a meta-path
    # finder: find_spec of a top-level name runs no code of it. Add its directory and look again.
    import importlib.util
    again = []
    for name in [n for n in f.badmodules if "." not in n]:
        try: spec = importlib.util.find_spec(name)
        except Exception: spec = None
        o = spec and spec.origin
        if o and os.path.isfile(o) and own(o):
            d = os.path.dirname(os.path.dirname(o) if spec.submodule_search_locations else o)
            if d not in f.path: f.path.append(d)
            again.append(name)
    for name in again: del f.badmodules[name]
    if again: f.run_script(path)
except Exception as e:
    # The file it stopped in (a SyntaxError names it; else the one being read), for the key_files hint.
    where = getattr(e, "filename", None) or getattr(f, "_dflash_reading", None) or path
    print("!\t%s: %s\t%s" % (type(e).__name__, str(e).replace("\t", " ").replace("\n", " "), where))
for u in unread: print("!\t" + u)
for name in sorted(f.badmodules):
    p = locate(name)  # code of its own that exists and was not read: the key cannot see it
    if p and not any(u.startswith(name + ":") for u in unread): print("!\t%s: its imports not all followed\t%s" % (name, p))
me = os.path.realpath(path)
for n, m in sorted(f.modules.items()):
    p = m.__file__
    if n != "__main__" and p and p.endswith(".py") and own(p) and os.path.realpath(p) != me: print(n + "\t" + p)
)PY";

/// "not followed: <error>" and the key_files line that keys the code by hand:
/// the folder of the file the scan stopped in, relative to the role's cwd.
/// `what` is the probe's "<error>\t<file>".
std::string NotFollowed(const std::string& what, const std::string& cwd) {
  size_t tab = what.rfind('\t');
  std::string error = what.substr(0, tab);
  if (tab == std::string::npos) return "not followed: " + error + "; list the code it imports in gate.key_files";
  fs::path dir = fs::path(Absolute(what.substr(tab + 1), cwd)).parent_path();
  fs::path base = cwd.empty() ? fs::current_path() : fs::path(cwd);
  std::string rel = dir.lexically_relative(base).string();
  std::string pattern = rel.empty() || rel == "." ? "*.py" : rel.rfind("..", 0) == 0 ? dir.string() + "/*.py" : rel + "/*.py";
  return "not followed: " + error + "; key that code by hand: gate.key_files = [\"" + pattern + "\"]";
}

/// Adds the files `file` imports (see kImportProbe), asking the role's Python
/// from the role's cwd with its PYTHONPATH.
void ImportedModules(const std::string& python, const std::string& file, bool as_module, const RoleSpec& role,
                     const std::string& pythonpath, std::vector<KeyFile>* out) {
  std::string cmd = (role.cwd.empty() ? "" : "cd " + ShellQuote(role.cwd) + " && ") +
                    (pythonpath.empty() ? "" : "PYTHONPATH=" + ShellQuote(pythonpath) + " ") + ShellQuote(python) +
                    " -c " + ShellQuote(kImportProbe) + " " + ShellQuote(file) + (as_module ? " 1" : " 0") +
                    " 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "re");
  if (!f) return;
  char buf[8192];
  while (std::fgets(buf, sizeof buf, f)) {
    std::string line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    std::string name = line.substr(0, tab), path = line.substr(tab + 1);
    if (name == "!") out->push_back({"imports of " + file, "", "", NotFollowed(path, role.cwd)});
    else if (IsRegularFile(path)) out->push_back(Hashed("import " + name, path));
  }
  ::pclose(f);
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
      if (!found.empty()) ImportedModules(cmd[0], found, /*as_module=*/true, role, pythonpath, out);
      return;
    }
    if (a.rfind("-m", 0) == 0 && a.size() > 2) {  // -mpkg.mod
      std::string mod = a.substr(2);
      std::string found = FindModuleNearby(mod, role.cwd, pythonpath);
      if (found.empty()) found = AskPythonForModule(cmd[0], mod, role.cwd, pythonpath);
      out->push_back(Hashed("module " + mod, found));
      if (!found.empty()) ImportedModules(cmd[0], found, /*as_module=*/true, role, pythonpath, out);
      return;
    }
    if (a == "-W" || a == "-X" || a == "--check-hash-based-pycs") {
      ++i;
      continue;
    }
    if (a == "-" ) return;  // stdin
    if (!a.empty() && a[0] == '-') continue;  // -u, -O, -B, -I, -E, -s, -S, -q, -OO, -bb ...
    std::string path = Absolute(a, role.cwd);
    bool there = IsRegularFile(path);
    out->push_back(Hashed("script " + a, there ? path : ""));
    if (there) ImportedModules(cmd[0], path, /*as_module=*/false, role, pythonpath, out);
    return;
  }
}

}  // namespace

bool PythonScriptOf(const RoleSpec& role, std::string* arg, std::string* path) {
  const std::vector<std::string>& cmd = role.command;
  if (!role.builtin.empty() || cmd.empty() || !IsPython(cmd[0])) return false;
  for (size_t i = 1; i < cmd.size(); ++i) {
    const std::string& a = cmd[i];
    if (a == "-" || a.rfind("-c", 0) == 0 || a.rfind("-m", 0) == 0) return false;
    if (a == "-W" || a == "-X" || a == "--check-hash-based-pycs") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    *arg = a;
    *path = Absolute(a, role.cwd);
    return true;
  }
  return false;
}

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
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        // A module the script imports is in the key already, under its name.
        bool listed = std::any_of(out.begin(), out.end(), [&](const KeyFile& f) { return f.path == g.gl_pathv[i]; });
        if (!listed && IsRegularFile(g.gl_pathv[i])) out.push_back(Hashed("key_files " + pattern, g.gl_pathv[i]));
      }
    }
    ::globfree(&g);
  }
  return out;
}

}  // namespace dflash

#include "launcher/plan/script_imports.h"

#include <cstdio>
#include <filesystem>

#include "launcher/plan/gate_key_files.h"

namespace dflash {
namespace {

/// argv: the script. Prints "<line>\t<module>" for each import the interpreter cannot find. sys.path as the script
/// will see it (its folder first, then PYTHONPATH and the install). A top-level name is found by importlib's
/// finders (an editable install's meta-path finder too), which run no code of it; a submodule by the path search
/// under its package's folders, as gate_key_files' probe does.
constexpr const char* kUnresolvedProbe = R"PY(import ast, importlib.machinery, importlib.util, os, re, sys
path = sys.argv[1]
sys.path[0] = os.path.dirname(os.path.abspath(path))
def mentions(spec, name):
    o = spec.origin
    if spec.submodule_search_locations is not None and o in (None, "namespace"): return False  # no code of its own
    if not o or not o.endswith(".py"): return True  # compiled or builtin: cannot tell
    try: text = open(o, encoding="utf-8", errors="replace").read()
    except OSError: return True
    return re.search(r"\b%s\b" % re.escape(name), text) is not None or re.search(r"import\s+\*", text) is not None
def found(name):
    parts = name.split(".")
    try: spec = importlib.util.find_spec(parts[0])
    except Exception: return True  # cannot tell: say nothing
    if spec is None: return False
    for i, part in enumerate(parts[1:], 1):
        where = spec.submodule_search_locations
        sub = None
        if where is not None:
            try: sub = importlib.machinery.PathFinder.find_spec(part, list(where))
            except Exception: return True
        if sub is None:
            # Not a file. Under a package: an attribute (from pkg import name) or a module it makes at import time
            # (six.moves) only if its __init__ names it. Under a module: any attribute it may make (a shim).
            return where is None or mentions(spec, part)
        spec = sub
    return True
with open(path, "rb") as fh: source = fh.read()
tree = ast.parse(source, path)
if b"sys.path" in source: print("~\tsys.path")  # it may add the folder itself: the warning says so
guarded = set()
for node in ast.walk(tree):
    if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        for stmt in node.body:
            for n in ast.walk(stmt): guarded.add(id(n))
for node in ast.walk(tree):
    if id(node) in guarded: continue
    if isinstance(node, ast.Import):
        for a in node.names:
            if not found(a.name): print("%d\t%s" % (node.lineno, a.name))
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        if not found(node.module): print("%d\t%s" % (node.lineno, node.module)); continue
        for a in node.names:
            if a.name != "*" and not found(node.module + "." + a.name):
                print("%d\t%s" % (node.lineno, node.module + "." + a.name))
)PY";

std::string ShellQuoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string EnvOf(const RoleSpec& role, const std::vector<std::pair<std::string, std::string>>& launcher_env,
                  const std::string& name) {
  for (const auto& [k, v] : role.env)
    if (k == name) return v;
  for (const auto& [k, v] : launcher_env)
    if (k == name) return v;
  return "";
}

}  // namespace

std::vector<UnresolvedImport> UnresolvedImports(const RunConfig& config,
                                                const std::vector<std::pair<std::string, std::string>>& launcher_env) {
  std::vector<UnresolvedImport> out;
  for (const RoleSpec& role : config.roles) {
    std::string arg, script;
    if (!PythonScriptOf(role, &arg, &script) || !std::filesystem::is_regular_file(script)) continue;
    const std::string python = role.command[0];
    const std::string pythonpath = EnvOf(role, launcher_env, "PYTHONPATH");
    // The role's PATH finds a bare "python", as the spawn will.
    const std::string path = EnvOf(role, launcher_env, "PATH");
    std::string cmd = (role.cwd.empty() ? "" : "cd " + ShellQuoted(role.cwd) + " && ") + "env " +
                      (path.empty() ? "" : "PATH=" + ShellQuoted(path) + " ") +
                      (pythonpath.empty() ? "-u PYTHONPATH " : "PYTHONPATH=" + ShellQuoted(pythonpath) + " ") +
                      ShellQuoted(python) + " -c " + ShellQuoted(kUnresolvedProbe) + " " + ShellQuoted(script) +
                      " 2>/dev/null";
    FILE* f = ::popen(cmd.c_str(), "re");
    if (!f) continue;
    const size_t first = out.size();
    bool changes_path = false;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) {
      std::string line = buf;
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      size_t tab = line.find('\t');
      if (line == "~\tsys.path") {
        changes_path = true;
        continue;
      }
      if (tab == std::string::npos || tab == 0 || line.find_first_not_of("0123456789") != tab) continue;
      out.push_back({role.name, script, std::stoi(line.substr(0, tab)), line.substr(tab + 1), python, false});
    }
    ::pclose(f);
    for (size_t i = first; i < out.size(); ++i) out[i].script_changes_sys_path = changes_path;
  }
  return out;
}

std::string FormatUnresolvedImports(const std::vector<UnresolvedImport>& found) {
  std::string s;
  for (const UnresolvedImport& u : found) {
    s += u.file + ":" + std::to_string(u.line) + ": warning: role[" + u.role + "]: imports " + u.module + ", which " +
         u.python + " cannot find (from the role's cwd, with its PYTHONPATH): the process would stop there" +
         (u.script_changes_sys_path ? " (unless the script's own sys.path change finds it)" : "") + "\n";
    if (u.module.rfind("dflash_launch.", 0) == 0) {
      s += "    hint: this dflash_launch has no module " + u.module +
           " (a name that moved keeps a shim for a release: docs/design.md); its modules: python -c 'import "
           "dflash_launch, pkgutil; print([m.name for m in pkgutil.walk_packages(dflash_launch.__path__, "
           "\"dflash_launch.\")])'\n";
    } else {
      s += "    hint: install it into that python's environment, add its folder to the role's env PYTHONPATH, or fix "
           "the name\n";
    }
  }
  return s;
}

}  // namespace dflash

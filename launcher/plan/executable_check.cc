#include "launcher/plan/executable_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include "common/redact.h"
#include "common/spawn.h"
#include "launcher/plan/gate_key_files.h"

namespace dflash {
namespace {

std::string PathOf(const RoleSpec& role, const EnvList& launcher_env) {
  for (const auto& [k, v] : role.env)
    if (k == "PATH") return v;
  for (const auto& [k, v] : launcher_env)
    if (k == "PATH") return v;
  return "/usr/local/bin:/usr/bin:/bin";  // what Spawn uses without a PATH
}

}  // namespace

std::vector<ConfigError> CheckCommands(const RunConfig& config, const EnvList& launcher_env) {
  std::vector<ConfigError> errors;
  for (const RoleSpec& role : config.roles) {
    if (role.command.empty() || role.command[0].empty()) continue;  // builtin, or reported already
    const std::string& program = role.command[0];
    std::string key = "role[" + role.name + "].command";
    std::string path_var = PathOf(role, launcher_env);
    std::string found;
    if (program.find('/') != std::string::npos) {
      found = program[0] == '/' || role.cwd.empty() ? program : role.cwd + "/" + program;
    } else {
      // An empty PATH entry means the process's cwd, as for execvp.
      std::string path_in_cwd;
      size_t start = 0;
      for (;;) {
        size_t end = path_var.find(':', start);
        std::string dir = path_var.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (dir.empty() || dir[0] != '/') dir = (role.cwd.empty() ? "." : role.cwd) + (dir.empty() ? "" : "/" + dir);
        path_in_cwd += (path_in_cwd.empty() ? "" : ":") + dir;
        if (end == std::string::npos) break;
        start = end + 1;
      }
      int errnum = 0;
      if (!ResolveProgram(program, path_in_cwd, &found, &errnum)) {
        errors.push_back({role.command_pos, key, "`" + program + "` is not found in the role's PATH",
                          "a program in PATH (or a path to one)", "nothing named `" + program + "` in " + RedactEnvValue("PATH", path_var),
                          "install it, give its full path, or set env = { PATH = \"...\" } for the role"});
        continue;
      }
    }
    struct stat st;
    std::string script, script_path;
    if (::stat(found.c_str(), &st) != 0) {
      errors.push_back({role.command_pos, key, "`" + found + "` is not found", "an existing executable file",
                        "no such file", "check the path (relative paths start at the role's cwd)"});
    } else if (!S_ISREG(st.st_mode) || ::access(found.c_str(), X_OK) != 0) {
      errors.push_back({role.command_pos, key, "`" + found + "` is not executable",
                        "an executable file", S_ISDIR(st.st_mode) ? "a directory" : "a file without execute permission",
                        S_ISDIR(st.st_mode) ? "name the program inside it" : "chmod +x " + found +
                                                                                  ", or run it through its interpreter"});
    } else if (PythonScriptOf(role, &script, &script_path) && ::stat(script_path.c_str(), &st) != 0) {
      // Python would exit 2 ("can't open file"), which reads as a config error of ours: say it here.
      errors.push_back({role.command_pos, key, "`" + program + "` would run `" + script + "`, which is not found",
                        "a Python script that exists (relative paths start at the role's cwd)",
                        "no file " + script_path,
                        "fix the name, or set cwd = \"...\" for the role to the directory it is in"});
    } else if (!script.empty() && !S_ISREG(st.st_mode) &&
               !(S_ISDIR(st.st_mode) && ::access((script_path + "/__main__.py").c_str(), F_OK) == 0)) {
      errors.push_back({role.command_pos, key, "`" + program + "` would run `" + script + "`, which is not a file",
                        "a Python script", S_ISDIR(st.st_mode) ? "a directory without __main__.py" : "not a regular file",
                        S_ISDIR(st.st_mode) ? "name the script inside it, or run a package with -m" : "name the script"});
    }
  }
  return errors;
}

}  // namespace dflash

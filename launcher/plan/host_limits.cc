#include "launcher/plan/host_limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>

namespace dflash {
namespace {

long ReadLong(const char* path, long fallback) {
  std::ifstream f(path);
  long v = fallback;
  return f >> v ? v : fallback;
}

/// Tasks (threads included: RLIMIT_NPROC counts those) of `uid`, from /proc.
long TasksOf(uid_t uid) {
  long n = 0;
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string dir = std::string("/proc/") + e->d_name;
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || st.st_uid != uid) continue;
    if (DIR* tasks = ::opendir((dir + "/task").c_str())) {
      while (dirent* t = ::readdir(tasks)) n += t->d_name[0] != '.';
      ::closedir(tasks);
    }
  }
  ::closedir(proc);
  return n;
}

/// Tasks on the whole host now: the 4th field of /proc/loadavg ("1/523").
long TasksOnHost() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c, running;
  if (!(f >> a >> b >> c >> running)) return 0;
  size_t slash = running.find('/');
  return slash == std::string::npos ? 0 : std::atol(running.c_str() + slash + 1);
}

std::string Kib(size_t bytes) { return std::to_string((bytes + 1023) / 1024) + " KiB"; }

}  // namespace

HostLimits ReadHostLimits() {
  HostLimits l;
  long arg_max = ::sysconf(_SC_ARG_MAX);
  l.arg_max = arg_max > 0 ? static_cast<size_t>(arg_max) : 131072;
  long pid_max = ReadLong("/proc/sys/kernel/pid_max", 0);
  if (pid_max > 0) l.free_pids = std::max(1L, pid_max - TasksOnHost());
  rlimit rl{};
  // The kernel does not hold root (CAP_SYS_RESOURCE / CAP_SYS_ADMIN) to RLIMIT_NPROC.
  if (::getuid() != 0 && ::getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    l.nproc_limit = static_cast<long>(rl.rlim_cur);
    l.user_processes = TasksOf(::getuid());
  }
  return l;
}

std::vector<ConfigError> CheckHostLimits(const Plan& plan, const EnvList& inherited, const HostLimits& limits) {
  std::vector<ConfigError> errors;
  std::vector<std::string> launcher_env;
  for (const auto& [k, v] : inherited) launcher_env.push_back(k + "=" + v);
  // As long as the real values can be: a socket path fills sun_path, a token is ~60 bytes.
  SpawnContext ctx;
  ctx.notify_socket.assign(108, 'x');
  ctx.run_token.assign(64, 'x');
  std::set<std::string> reported;  // one error per role and key
  auto report = [&](const RoleSpec& role, SourcePos pos, const std::string& key, const std::string& message,
                    const std::string& found, const std::string& hint) {
    if (!reported.insert(role.name + "/" + key).second) return;
    errors.push_back({pos, key, message, "at most what execve takes on this host", found, hint});
  };
  std::vector<const ProcessPlan*> all;
  for (const ProcessPlan& p : plan.warmups) all.push_back(&p);
  for (const ProcessPlan& p : plan.processes) all.push_back(&p);
  long tasks = 0;
  std::set<std::pair<size_t, bool>> seen;  // (role, warm-up): its processes differ in a few digits only
  for (const ProcessPlan* p : all) {
    const RoleSpec& role = plan.RoleOf(*p);
    const std::string rkey = "role[" + role.name + "]";
    tasks += plan.NeedsWorker(*p) ? 2 : 1;  // dflash-worker and its payload
    if (!seen.insert({p->role_index, p->warmup}).second) continue;
    std::vector<std::string> argv = plan.ExecArgv(*p);
    std::vector<std::string> envp = SpawnEnvironment(launcher_env, plan.ProcessEnv(*p, 0, &ctx));
    // Where a string comes from: the role's command, its env, or the launcher's own environment.
    size_t total = (argv.size() + envp.size() + 2) * sizeof(char*);
    size_t biggest = 0;
    std::string biggest_key;
    SourcePos biggest_pos = role.pos;
    auto source_of = [&](const std::string& e, std::string* key, SourcePos* pos) {
      std::string name = e.substr(0, e.find('='));
      for (size_t j = 0; j < role.env.size(); ++j)
        if (role.env[j].first == name) {
          *key = rkey + ".env." + name;
          *pos = j < role.env_pos.size() ? role.env_pos[j] : role.pos;
          return;
        }
      *key = "environment: " + name;
      *pos = role.pos;
    };
    for (const std::string& a : argv) {
      total += a.size() + 1;
      if (a.size() + 1 > biggest) biggest = a.size() + 1, biggest_key = rkey + ".command", biggest_pos = role.command_pos;
      if (a.size() + 1 > limits.max_arg_strlen)
        report(role, role.command_pos.line ? role.command_pos : role.pos, rkey + ".command",
               "an argument of " + Kib(a.size() + 1) + " is over the kernel's limit for one string (MAX_ARG_STRLEN, " +
                   Kib(limits.max_arg_strlen) + "): execve would fail with E2BIG (exit 126)",
               Kib(a.size() + 1), "pass large data in a file and its path as the argument");
    }
    for (const std::string& e : envp) {
      total += e.size() + 1;
      std::string key;
      SourcePos pos;
      source_of(e, &key, &pos);
      if (e.size() + 1 > biggest) biggest = e.size() + 1, biggest_key = key, biggest_pos = pos;
      if (e.size() + 1 > limits.max_arg_strlen)
        report(role, pos, key,
               "NAME=value of " + Kib(e.size() + 1) + " is over the kernel's limit for one string (MAX_ARG_STRLEN, " +
                   Kib(limits.max_arg_strlen) + "): execve would fail with E2BIG (exit 126)",
               Kib(e.size() + 1),
               key.rfind("environment: ", 0) == 0 ? "the launcher's own environment holds it: unset it before the run"
                                                   : "put large data in a file and its path in the variable");
    }
    if (limits.arg_max > 0 && total > limits.arg_max)
      report(role, biggest_pos, rkey + " argv + environment",
             "the arguments and environment of " + p->name + " take " + Kib(total) + ", over this host's ARG_MAX (" +
                 Kib(limits.arg_max) + ", a quarter of the stack limit): execve would fail with E2BIG (exit 126)",
             Kib(total), "the biggest part is " + biggest_key + " (" + Kib(biggest) + "); pass large data in a file");
  }
  // Fork fails with EAGAIN past either limit: after the first processes started.
  const RoleSpec* largest = nullptr;
  for (const RoleSpec& r : plan.config.roles)
    if (!largest || r.process_count() > largest->process_count()) largest = &r;
  auto count_error = [&](const std::string& what, long limit, const std::string& hint) {
    errors.push_back({largest ? largest->pos : SourcePos{plan.config.path, 1, 1}, "role",
                      "this node would start " + std::to_string(tasks) + " processes (payloads and their dflash-worker), " +
                          what,
                      "at most " + std::to_string(limit), std::to_string(tasks), hint});
  };
  if (largest && limits.free_pids > 0 && tasks > limits.free_pids)
    count_error("but only " + std::to_string(limits.free_pids) + " process ids are free on this host (pid_max)",
                limits.free_pids, "fewer processes per node (the largest role: " + largest->name + ", " +
                                    std::to_string(largest->process_count()) + "), or raise kernel.pid_max");
  else if (largest && limits.nproc_limit >= 0 && tasks + limits.user_processes > limits.nproc_limit)
    count_error("and this user already runs " + std::to_string(limits.user_processes) + " of the " +
                    std::to_string(limits.nproc_limit) + " its RLIMIT_NPROC allows",
                limits.nproc_limit - limits.user_processes,
                "fewer processes per node (the largest role: " + largest->name + "), or raise `ulimit -u`");
  return errors;
}

}  // namespace dflash

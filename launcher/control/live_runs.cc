#include "launcher/control/live_runs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "common/fd.h"
#include "common/proc_info.h"

namespace dflash {

bool RunRegistryDir(bool create, std::string* dir, std::string* err) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  std::string d = xdg != nullptr && xdg[0] == '/' ? std::string(xdg) + "/dflash-launch"
                                                  : "/tmp/dflash-launch-" + std::to_string(::geteuid());
  if (create && ::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
    *err = ErrnoMessage("mkdir(" + d + ")", errno);
    return false;
  }
  struct stat st;
  if (::lstat(d.c_str(), &st) != 0) {
    if (errno == ENOENT && !create) {
      *dir = d;
      return true;  // nothing registered yet
    }
    *err = ErrnoMessage("stat(" + d + ")", errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *err = "the run registry " + d + " is " +
           (S_ISLNK(st.st_mode) ? std::string("a symlink")
                                : !S_ISDIR(st.st_mode) ? std::string("not a directory")
                                                       : "owned by uid " + std::to_string(st.st_uid) + ", mode " +
                                                             mode) +
           "; it must be your own 0700 directory (remove it, or set XDG_RUNTIME_DIR)";
    return false;
  }
  *dir = d;
  return true;
}

RunRegistration::~RunRegistration() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

bool RunRegistration::Register(RunEntry e, std::string* err) {
  std::string dir;
  if (!RunRegistryDir(true, &dir, err)) return false;
  e.pid = ::getpid();
  e.start_time = ProcessStartTime(e.pid);
  e.started_unix = static_cast<int64_t>(std::time(nullptr));
  nlohmann::json j = {{"run_id", e.run_id}, {"run_dir", e.run_dir}, {"config", e.config},
                      {"pid", e.pid},       {"start_time", e.start_time}, {"started_unix", e.started_unix}};
  std::string path = dir + "/" + std::to_string(e.pid) + ".json";
  if (!WriteFileAtomic(path, j.dump() + "\n", err, 0600)) return false;
  path_ = path;
  return true;
}

bool ListRuns(std::vector<RunEntry>* out, std::string* err) {
  out->clear();
  std::string dir;
  if (!RunRegistryDir(false, &dir, err)) return false;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return errno == ENOENT ? true : (*err = ErrnoMessage("opendir(" + dir + ")", errno), false);
  while (dirent* de = ::readdir(d)) {
    std::string name = de->d_name;
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    std::string path = dir + "/" + name, text, e;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (!ReadFile(path, &text, &e)) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    RunEntry r;
    try {
      r.run_id = j.at("run_id").get<std::string>();
      r.run_dir = j.at("run_dir").get<std::string>();
      r.config = j.value("config", "");
      r.pid = j.at("pid").get<pid_t>();
      r.start_time = j.at("start_time").get<uint64_t>();
      r.started_unix = j.at("started_unix").get<int64_t>();
    } catch (const nlohmann::json::exception&) {
      continue;  // half-written by hand, or not ours: not a run
    }
    if (!ProcessAlive(r.pid, r.start_time)) {
      ::unlink(path.c_str());  // its supervisor died without cleaning up
      continue;
    }
    out->push_back(std::move(r));
  }
  ::closedir(d);
  std::sort(out->begin(), out->end(), [](const RunEntry& a, const RunEntry& b) {
    return a.started_unix != b.started_unix ? a.started_unix < b.started_unix : a.pid < b.pid;
  });
  return true;
}

}  // namespace dflash

#include "launcher/supervise/cgroup_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

namespace dflash {
namespace {

bool WriteText(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return false;
  return ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

bool Populated(const std::string& dir) {
  std::string events, err;
  if (!ReadFile(dir + "/cgroup.events", &events, &err)) return false;  // gone: empty
  return events.find("populated 1") != std::string::npos;
}

}  // namespace

void RunCgroup::RemoveTree(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> subs;
    while (struct dirent* e = ::readdir(d))
      if (e->d_type == DT_DIR && std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        subs.push_back(dir + "/" + e->d_name);
    ::closedir(d);
    for (const std::string& s : subs) RemoveTree(s);
  }
  ::rmdir(dir.c_str());
}


bool ParseCgroupMode(const char* value, CgroupMode* out, std::string* err) {
  std::string v = value ? value : "";
  if (v.empty() || v == "auto") *out = CgroupMode::kAuto;
  else if (v == "off" || v == "0") *out = CgroupMode::kOff;
  else if (v == "require" || v == "1") *out = CgroupMode::kRequire;
  else {
    *err = "DFLASH_CGROUP=" + v + ": expected auto, off or require";
    return false;
  }
  return true;
}

bool OwnCgroupDir(std::string* dir, std::string* err) { return ProcessCgroupDir(0, dir, err); }

bool ProcessCgroupDir(pid_t pid, std::string* dir, std::string* err) {
  std::string text, e;
  std::string proc = pid > 0 ? "/proc/" + std::to_string(pid) : std::string("/proc/self");
  if (!ReadFile(proc + "/cgroup", &text, &e)) {
    *err = e;
    return false;
  }
  std::string rel;
  bool found = false;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("0::", 0) == 0) {
      rel = line.substr(3);
      found = true;
    }
  if (!found) {
    *err = "not in a cgroup v2 hierarchy (" + proc + "/cgroup has no 0:: line)";
    return false;
  }
  if (!ReadFile("/proc/self/mountinfo", &text, &e)) {
    *err = e;
    return false;
  }
  // mountinfo: id parent major:minor root mountpoint options [optional...] - fstype source super
  std::istringstream mounts(text);
  for (std::string line; std::getline(mounts, line);) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream f(line.substr(0, dash));
    std::string id, parent, devno, root, mountpoint;
    f >> id >> parent >> devno >> root >> mountpoint;
    // The mount shows the hierarchy from `root` on: our path must lie below it.
    std::string sub = rel;
    if (root != "/") {
      if (rel.rfind(root, 0) != 0) continue;
      sub = rel.substr(root.size());
    }
    *dir = mountpoint + (sub == "/" ? "" : sub);
    return true;
  }
  *err = "no cgroup2 file system is mounted";
  return false;
}

RunCgroup::~RunCgroup() = default;

bool RunCgroup::Create(const std::string& token, std::string* err) {
  std::string own;
  if (!OwnCgroupDir(&own, err)) return false;
  std::string dir = own + "/dflash-" + token;
  if (::mkdir(dir.c_str(), 0755) != 0) {
    *err = ErrnoMessage("mkdir(" + dir + ")", errno);
    return false;
  }
  // cgroup.kill (5.14+) is what makes the sub-tree worth having.
  if (::access((dir + "/cgroup.kill").c_str(), W_OK) != 0) {
    *err = "this kernel has no cgroup.kill (Linux 5.14+)";
    ::rmdir(dir.c_str());
    return false;
  }
  // Memory accounting needs the controller enabled in every parent down to the
  // leaves; in a cgroup that holds processes itself (not the root) the kernel
  // refuses that (no internal processes): then we only lose memory.peak.
  std::string controllers, e;
  if (ReadFile(own + "/cgroup.controllers", &controllers, &e) && controllers.find("memory") != std::string::npos) {
    WriteText(own + "/cgroup.subtree_control", "+memory");
    memory_ = WriteText(dir + "/cgroup.subtree_control", "+memory");
  }
  dir_ = dir;
  return true;
}

UniqueFd RunCgroup::MakeLeaf(const std::string& leaf, std::string* err) {
  std::string d = LeafDir(leaf);
  if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
    *err = ErrnoMessage("mkdir(" + d + ")", errno);
    return UniqueFd();
  }
  UniqueFd fd(::open((d + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) *err = ErrnoMessage("open(" + d + "/cgroup.procs)", errno);
  return fd;
}

bool RunCgroup::Kill(const std::string& dir) { return WriteText(dir + "/cgroup.kill", "1"); }

int64_t RunCgroup::MemoryPeak(const std::string& dir) {
  std::string text, err;
  if (!ReadFile(dir + "/memory.peak", &text, &err)) return -1;
  return std::strtoll(text.c_str(), nullptr, 10);
}

bool RunCgroup::WaitEmpty(const std::string& dir, int timeout_ms) {
  // cgroup.events raises POLLPRI when "populated" changes.
  UniqueFd fd(::open((dir + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Populated(dir)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (fd) {
      pollfd p{fd.get(), POLLPRI, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    } else {
      ::usleep(5000);
    }
  }
  return true;
}

void RunCgroup::RemoveLeaf(const std::string& leaf) {
  if (!active()) return;
  std::string d = LeafDir(leaf);
  if (Populated(d)) {
    Kill(d);
    WaitEmpty(d, 2000);
  }
  RemoveTree(d);
}

void RunCgroup::Destroy() {
  if (!active()) return;
  Kill(dir_);
  WaitEmpty(dir_, 2000);
  RemoveTree(dir_);
  dir_.clear();
}

std::string LeafName(size_t index, int attempt) {
  return "p" + std::to_string(index) + ".a" + std::to_string(attempt);
}

}  // namespace dflash

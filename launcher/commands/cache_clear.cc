#include "launcher/commands/cache_clear.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <functional>
#include <memory>
#include <set>

#include "common/fd.h"
#include "common/secure_path.h"

namespace dflash {
namespace {

std::string Parent(const std::string& rel) {
  size_t slash = rel.find_last_of('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

/// The tree as one walk saw it: what is where, and which directories hold anything foreign.
struct Tree {
  std::map<std::string, std::vector<std::string>> children;  // "" is the root
  std::map<std::string, struct stat> stat;
  std::map<std::string, std::string> kind;                   // files only ("" = foreign)
  std::set<std::string> impure;                              // dirs that are, or hold, something foreign

  void MarkImpure(std::string rel) {
    for (;;) {
      if (!impure.insert(rel).second || rel.empty()) return;
      rel = Parent(rel);
    }
  }

  /// Files under `rel` (itself if a file), by kind.
  void Count(const std::string& rel, std::map<std::string, KindStats>* by_kind, uint64_t* total) const {
    const struct stat& st = stat.at(rel);
    if (!S_ISDIR(st.st_mode)) {
      ++*total;
      if (by_kind) {
        KindStats& k = (*by_kind)[kind.count(rel) && !kind.at(rel).empty() ? kind.at(rel) : "other"];
        ++k.files;
        k.bytes += static_cast<uint64_t>(st.st_size);
      }
      return;
    }
    if (auto it = children.find(rel); it != children.end())
      for (const std::string& c : it->second) Count(c, by_kind, total);
  }
};

bool ReadTree(const std::string& dir, Tree* t, std::string* err) {
  return WalkTree(dir, [&](const std::string& rel, const struct stat& st) {
    if (rel == ".dflash") return false;  // the gate's own: handled apart
    t->children[Parent(rel)].push_back(rel);
    t->stat[rel] = st;
    if (S_ISDIR(st.st_mode)) {
      if (!IsCacheDirPath(rel)) {
        t->MarkImpure(rel);
        return false;  // not a place Inductor writes: left whole, no need to look inside
      }
      t->children[rel];
      return true;
    }
    std::string k = S_ISREG(st.st_mode) ? CacheKindOf(rel) : "";
    t->kind[rel] = k;
    if (k.empty()) t->MarkImpure(rel);
    return true;
  }, err);
}

}  // namespace

std::string ClearReport::Describe() const {
  std::string kinds;
  uint64_t bytes = 0;
  for (const auto& [name, k] : removed) {
    if (k.files == 0) continue;
    kinds += (kinds.empty() ? "" : ", ") + name + " " + std::to_string(k.files) + " (" + HumanBytes(k.bytes) + ")";
    bytes += k.bytes;
  }
  std::string s = "removed " + std::to_string(files_removed) + " files";
  if (!kinds.empty()) s += " (" + kinds + "; " + HumanBytes(bytes) + ")";
  s += " and " + std::to_string(ready_removed) + " READY marker" + (ready_removed == 1 ? "" : "s");
  return s;
}

namespace {

/// Leftovers of a clear or import that was killed: under the gate nobody else is using them.
bool RemoveLeftovers(int meta_fd, ClearReport* report, std::string* err) {
  std::vector<std::string> old;
  if (std::unique_ptr<DIR, int (*)(DIR*)> d(::fdopendir(::dup(meta_fd)), ::closedir); d)
    while (struct dirent* e = ::readdir(d.get())) {
      std::string n = e->d_name;
      if (n.rfind("trash-", 0) == 0 || n.rfind("import-", 0) == 0) old.push_back(n);
    }
  for (const std::string& n : old) {
    std::map<std::string, KindStats>& k = report->removed;
    uint64_t count = 0;
    if (!RemoveTreeAt(meta_fd, n, &count, err)) return false;
    k["leftovers"].files += count;
    report->files_removed += count;
  }
  return true;
}

/// `.dflash/trash-<time>-<pid>`: where this clear moves everything before deleting it.
bool MakeTrash(const std::string& dir, int meta_fd, std::string* trash, UniqueFd* trash_fd, std::string* err) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  *trash = std::string("trash-") + stamp + "-" + std::to_string(::getpid());
  if (::mkdirat(meta_fd, trash->c_str(), 0700) != 0) {
    *err = ErrnoMessage("mkdir " + dir + "/.dflash/" + *trash, errno);
    return false;
  }
  trash_fd->reset(OpenBeneath(meta_fd, *trash, O_RDONLY | O_DIRECTORY));
  if (!*trash_fd) {
    *err = ErrnoMessage("open " + dir + "/.dflash/" + *trash, errno);
    return false;
  }
  return true;
}

/// Promises first: READY markers go aside in one rename, an empty ready/ takes their place.
bool SetReadyAside(const std::string& dir, int meta_fd, int trash_fd, ClearReport* report, std::string* err) {
  struct stat st {};
  if (::fstatat(meta_fd, "ready", &st, AT_SYMLINK_NOFOLLOW) == 0) {
    uint64_t markers = 0;
    if (std::unique_ptr<DIR, int (*)(DIR*)> d(::fdopendir(OpenBeneath(meta_fd, "ready", O_RDONLY | O_DIRECTORY)),
                                              ::closedir);
        d)
      while (struct dirent* e = ::readdir(d.get())) {
        std::string n = e->d_name;
        if (n.size() > 5 && n[0] != '.' && n.compare(n.size() - 5, 5, ".json") == 0) ++markers;
      }
    if (::renameat(meta_fd, "ready", trash_fd, "ready") != 0) {
      *err = ErrnoMessage("rename " + dir + "/.dflash/ready", errno);
      return false;
    }
    report->ready_removed = markers;
  }
  if (::mkdirat(meta_fd, "ready", 0700) != 0 && errno != EEXIST) {
    *err = ErrnoMessage("mkdir " + dir + "/.dflash/ready", errno);
    return false;
  }
  return true;
}

/// Depth first from the root: a pure entry goes aside whole (into `trash_fd`, counted into
/// report->removed); an impure cache dir is descended into; anything else is left, and reported
/// once at its top-most path.
bool MoveOursAside(const std::string& dir, int cache_fd, int trash_fd, Tree* tree, ClearReport* report,
                   std::string* err) {
  uint64_t moved = 0;
  std::map<std::string, KindStats> by_kind;
  std::function<bool(const std::string&)> visit = [&](const std::string& parent) -> bool {
    for (const std::string& c : tree->children[parent]) {
      bool is_dir = S_ISDIR(tree->stat[c].st_mode);
      bool ours = is_dir ? IsCacheDirPath(c) && !tree->impure.count(c) : !tree->kind[c].empty();
      if (ours) {
        uint64_t n = 0;
        tree->Count(c, &by_kind, &n);
        if (::renameat(cache_fd, c.c_str(), trash_fd, std::to_string(moved++).c_str()) != 0) {
          *err = ErrnoMessage("rename " + dir + "/" + c, errno);
          return false;
        }
      } else if (is_dir && IsCacheDirPath(c)) {
        if (!visit(c)) return false;
      } else {
        uint64_t n = is_dir ? 0 : 1;
        std::string ignored;
        if (is_dir)  // not walked before: count its files now (lstat, links are not followed)
          WalkTree(dir + "/" + c, [&](const std::string&, const struct stat& s) {
            if (!S_ISDIR(s.st_mode)) ++n;
            return true;
          }, &ignored);
        report->left.emplace_back(c + (is_dir ? "/" : ""), n);
      }
    }
    return true;
  };
  bool ok = visit("");
  for (const auto& [k, s] : by_kind) {
    report->removed[k].files += s.files;
    report->removed[k].bytes += s.bytes;
  }
  return ok;
}

}  // namespace

bool ClearCache(const std::string& dir, ClearReport* report, std::string* err) {
  *report = ClearReport{};
  UniqueFd cache_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  UniqueFd meta_fd(cache_fd ? OpenBeneath(cache_fd.get(), ".dflash", O_RDONLY | O_DIRECTORY) : -1);
  if (!meta_fd) {
    *err = ErrnoMessage("open " + dir + "/.dflash", errno);
    return false;
  }
  if (!RemoveLeftovers(meta_fd.get(), report, err)) return false;
  std::string trash;
  UniqueFd trash_fd;
  if (!MakeTrash(dir, meta_fd.get(), &trash, &trash_fd, err)) return false;
  if (!SetReadyAside(dir, meta_fd.get(), trash_fd.get(), report, err)) return false;

  Tree tree;
  if (!ReadTree(dir, &tree, err)) return false;
  bool ok = MoveOursAside(dir, cache_fd.get(), trash_fd.get(), &tree, report, err);
  uint64_t markers = 0, files = 0;
  std::string rm_err;
  bool removed = RemoveTreeAt(trash_fd.get(), "ready", &markers, &rm_err) &&
                 RemoveTreeAt(meta_fd.get(), trash, &files, &rm_err);
  report->files_removed += files;
  if (ok && !removed) {
    *err = rm_err;
    return false;
  }
  return ok;
}

}  // namespace dflash

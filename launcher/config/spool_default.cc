#include "launcher/config/spool_default.h"

#include <sys/random.h>
#include <sys/stat.h>

namespace dflash {

bool UnguessableSpoolDir(const PathUse& use, RunSpec* run, const std::string& why) {
  unsigned char bytes[8];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) return false;
  std::string alt = run->spool_dir + "-";
  for (unsigned char b : bytes) {
    static const char* k = "0123456789abcdef";
    alt += k[b >> 4];
    alt += k[b & 15];
  }
  std::string alt_why;
  struct stat st {};
  if (::lstat(alt.c_str(), &st) == 0 || !CheckSecurePath(alt, use, &alt_why)) return false;
  size_t fix = why.rfind("; fix: ");
  run->spool_dir_note = "the default spool dir is refused (" + (fix == std::string::npos ? why : why.substr(0, fix)) +
                        "): this run uses " + alt + " instead";
  run->spool_dir = alt;
  return true;
}

void AddSpoolDirWarning(const RunConfig& config, std::vector<ConfigError>* warnings) {
  if (config.run.spool_dir_note.empty()) return;
  ConfigError w;
  w.warning = true;
  w.pos.file = config.path;
  w.key = "run.spool_dir";
  w.message = config.run.spool_dir_note;
  w.hint = "set [run] spool_dir to a directory of your own to choose it (or remove the other user's)";
  warnings->push_back(std::move(w));
}

}  // namespace dflash

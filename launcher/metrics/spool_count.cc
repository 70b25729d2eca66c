#include "launcher/metrics/spool_count.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstring>
#include <string_view>

#include "contract/spool_layout.h"

namespace dflash {
namespace {

namespace layout = spool::layout;

bool IsFrame(std::string_view name) {
  const std::string_view ext = layout::kFrameExt;
  return name.size() > ext.size() && name.substr(name.size() - ext.size()) == ext;
}

/// Entries of `dir` (not . and ..): every one when `frames_only` is false, else only frame files;
/// with `subdirs`, the counts of its subdirectories instead (claimed/<consumer>/, pending/<consumer>/).
int64_t Count(const std::string& dir, bool frames_only, bool subdirs = false) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int64_t n = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (subdirs) {
      if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) n += Count(dir + "/" + e->d_name, true);
      continue;
    }
    if (!frames_only || IsFrame(e->d_name)) ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace

SpoolCounts CountSpool(const std::string& root, bool with_done) {
  SpoolCounts c;
  struct stat st;
  if (root.empty() || ::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return c;
  c.present = true;
  c.writing = Count(layout::Under(root, layout::kTmp), false);
  c.ready = Count(layout::Under(root, layout::kReady), true);
  c.claimed = Count(layout::Under(root, layout::kClaimed), true, true);
  c.pending = Count(layout::Under(root, layout::kPending), true, true);  // <position>.<frame>.safetensors: frames too
  if (with_done) c.done = Count(layout::Under(root, layout::kDone), true);
  c.rejected = Count(layout::Under(root, layout::kRejected), true);
  return c;
}

}  // namespace dflash

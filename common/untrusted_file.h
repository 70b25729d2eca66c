// Reading a file that someone else controls -- a payload's metrics or error file, a file the gate key hashed --
// on a thread that must never wait for it (the supervisor's loop). A payload runs as our user and can put
// anything at such a path: a FIFO (a blocking open() waits for a writer forever), a link to /dev/zero (a
// read to the end never ends, then std::bad_alloc), a file of gigabytes. So: open O_NONBLOCK|O_NOFOLLOW,
// fstat the fd, read only a regular file of the expected owner, and at most `limit` bytes of it; anything
// else is "unreadable" with a reason a person can act on.
#pragma once

#include <cstddef>
#include <string>

namespace dflash {

/// What a file must be to be read.
struct UntrustedFileRules {
  /// Bytes read at most: a larger file is unreadable (its size is said), never read whole.
  size_t limit = size_t{1} << 20;
  /// A directory of ours that `path` lies under: every component below it is opened without following a link
  /// (a payload cannot swap its attempt dir for a link to somewhere else). "": `path` is opened as it is.
  std::string beneath;
  /// The last component may be a symlink (a key file the config names may be one). Never with `beneath`.
  bool follow_link = false;
  /// Owned by anyone (a key file may be root's); else only by our effective uid.
  bool any_owner = false;
};

enum class UntrustedRead {
  kOk,          ///< `*out` holds the whole file
  kAbsent,      ///< it (or a directory on its way) does not exist: nothing was written
  kUnreadable,  ///< `*why` says what it is instead ("a FIFO, not a regular file")
};

/// Reads `path` under `rules` without blocking on what it turns out to be (beyond the read of a regular
/// file's first `limit` bytes). `*why` is set for kUnreadable: the reason only, without the path.
UntrustedRead ReadUntrustedFile(const std::string& path, const UntrustedFileRules& rules, std::string* out,
                                std::string* why);

/// "unreadable (<why>)": how a summary or a console line shows a file that was not read.
std::string Unreadable(const std::string& why);

}  // namespace dflash

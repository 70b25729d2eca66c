#include "launcher/control/control_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/secure_path.h"
#include "launcher/control/control_wire.h"

namespace dflash {

ConnectResult ConnectControl(const std::string& run_dir, UniqueFd* out, std::string* err) {
  const std::string path = run_dir + "/control.sock";
  UniqueFd dir(::open(run_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    *err = ErrnoMessage("open(" + run_dir + ")", errno);
    return errno == ENOENT ? ConnectResult::kGone : ConnectResult::kFailed;
  }
  struct stat st;
  if (::fstat(dir.get(), &st) != 0) {
    *err = ErrnoMessage("stat(" + run_dir + ")", errno);
    return ConnectResult::kFailed;
  }
  const uid_t me = ::geteuid();
  if (st.st_uid != me || (st.st_mode & 022) != 0) {
    *err = "refusing " + path + ": its directory (owner uid " + std::to_string(st.st_uid) + ", mode " +
           FormatMode(st.st_mode) + ") could let another user put a socket there; the run's dir must be yours and "
           "not group/other-writable (chmod go-w " + run_dir + ")";
    return ConnectResult::kInsecure;
  }
  if (::fstatat(dir.get(), "control.sock", &st, AT_SYMLINK_NOFOLLOW) != 0) {
    *err = errno == ENOENT ? "no control socket at " + path + ": the run has ended"
                           : ErrnoMessage("stat(" + path + ")", errno);
    return errno == ENOENT ? ConnectResult::kGone : ConnectResult::kFailed;
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != me || (st.st_mode & 077) != 0) {
    *err = "refusing " + path + ": " +
           (!S_ISSOCK(st.st_mode) ? std::string("not a socket")
                                  : "owner uid " + std::to_string(st.st_uid) + ", mode " + FormatMode(st.st_mode)) +
           "; a run's control socket is yours and mode 0600 (someone changed it: anyone could be listening)";
    return ConnectResult::kInsecure;
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    *err = ErrnoMessage("socket(AF_UNIX)", errno);
    return ConnectResult::kFailed;
  }
  // Through the directory fd we checked: short enough for sun_path whatever the
  // run dir's length, and the same directory even if its path is swapped now.
  std::string via = "/proc/self/fd/" + std::to_string(dir.get()) + "/control.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, via.c_str(), via.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int e = errno;
    *err = ErrnoMessage("connect(" + path + ")", e);
    if (e == ECONNREFUSED || e == ENOENT) {
      *err = "the run at " + run_dir + " is not answering (its supervisor has ended)";
      return ConnectResult::kGone;
    }
    return ConnectResult::kFailed;
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != me) {
    *err = "refusing " + path + ": it is served by uid " + std::to_string(cred.uid) + ", not by you";
    return ConnectResult::kInsecure;
  }
  *out = std::move(fd);
  return ConnectResult::kOk;
}

bool CallControl(int fd, const ControlRequest& request, ControlReply* reply, std::chrono::milliseconds timeout,
                 std::string* err) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line = EncodeRequest(request);
  std::string in;
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    *err = ErrnoMessage("send to the run", errno);
    // A server that refused us said why before it hung up: show that instead.
    char buf[4096];
    ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0 && DecodeReply(std::string(buf, static_cast<size_t>(r)).substr(0, std::string(buf, r).find('\n')),
                             reply, err))
      return true;
    return false;
  }
  for (;;) {
    size_t nl = in.find('\n');
    if (nl != std::string::npos) return DecodeReply(in.substr(0, nl), reply, err);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *err = "the run did not answer within " + std::to_string(timeout.count()) + " ms";
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[65536];
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = in.empty() ? "the run hung up without an answer (it is ending?)" : "the run's answer was cut short";
      return false;
    }
    in.append(buf, static_cast<size_t>(r));
  }
}

}  // namespace dflash

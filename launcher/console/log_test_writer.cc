// A child process for the log path's tests and benchmark (never installed).
//   log_test_writer lines OUT_SEED OUT_N ERR_SEED ERR_N MIN MAX PARTIAL_LAST CHUNK_SEED
//       writes MakeLines(OUT_SEED..) to fd 1 and MakeLines(ERR_SEED..) to fd 2,
//       interleaved, in chunks of random size (1 byte .. 80 KiB) that cut lines anywhere.
//   log_test_writer bench BYTES
//       writes a 1 MiB block of 100-byte lines (MakeLines(7, ...)) to fd 1 until BYTES, in 64 KiB writes.
//   log_test_writer fds
//       prints the fds it has open, one per line: what it inherited.
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "launcher/console/log_test_lines.h"

namespace {

using dflash::logtest::MakeLines;
using dflash::logtest::Rng;

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

uint64_t Arg(char** argv, int i) { return std::strtoull(argv[i], nullptr, 10); }

int Lines(char** argv) {
  std::string out = MakeLines(Arg(argv, 2), Arg(argv, 3), Arg(argv, 6), Arg(argv, 7), Arg(argv, 8));
  std::string err = MakeLines(Arg(argv, 4), Arg(argv, 5), Arg(argv, 6), Arg(argv, 7), Arg(argv, 8));
  Rng rng(Arg(argv, 9));
  size_t o = 0, e = 0;
  while (o < out.size() || e < err.size()) {
    bool to_out = e >= err.size() || (o < out.size() && rng.Next() % 8 != 0);
    std::string& s = to_out ? out : err;
    size_t& pos = to_out ? o : e;
    // Mostly small writes (like a line-buffered program), some big ones.
    size_t n = rng.Next() % 16 == 0 ? rng.Range(1, 80 << 10) : rng.Range(1, 600);
    n = std::min(n, s.size() - pos);
    if (!WriteAll(to_out ? 1 : 2, s.data() + pos, n)) return 3;
    pos += n;
  }
  return 0;
}

int Bench(char** argv) {
  uint64_t total = Arg(argv, 2);
  std::string block = MakeLines(7, (1 << 20) / 100, 99, 99, false);  // 100 bytes with '\n'
  uint64_t done = 0;
  size_t pos = 0;
  while (done < total) {
    size_t n = std::min<uint64_t>({uint64_t{64} << 10, block.size() - pos, total - done});
    if (!WriteAll(1, block.data() + pos, n)) return 3;
    done += n;
    pos = (pos + n) % block.size();
  }
  return 0;
}

int Fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return 3;
  std::vector<int> fds;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (std::atoi(e->d_name) == ::dirfd(d)) continue;
    fds.push_back(std::atoi(e->d_name));
  }
  ::closedir(d);
  std::sort(fds.begin(), fds.end());
  std::string out;
  for (int fd : fds) out += std::to_string(fd) + "\n";
  return WriteAll(1, out.data(), out.size()) ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "lines" && argc == 10) return Lines(argv);
  if (mode == "bench" && argc == 3) return Bench(argv);
  if (mode == "fds") return Fds();
  std::fprintf(stderr, "usage: see the top of log_test_writer.cc\n");
  return 2;
}

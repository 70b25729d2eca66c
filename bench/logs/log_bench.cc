// Aggregate throughput of the log path: N writer processes print 100-byte
// lines as fast as they can; the router copies them to files and the console
// (/dev/null by default) from one epoll loop, as the supervisor does.
//
//   log_bench [--writers 8] [--mib 32] [--rounds 3] [--dir /tmp/dflash_log_bench]
//             [--console null|none|stdout] [--read-kib 64]
//
// Prints MB/s per round (wall time from the first spawn to the last EOF,
// counting every byte that reached the files), the supervisor's CPU time,
// and checks each file byte for byte (0 lost).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "launcher/console/console.h"
#include "launcher/console/log_router.h"
#include "launcher/console/log_test_lines.h"
#include "launcher/console/log_test_util.h"
#include "testing/process.h"

namespace {

using namespace dflash;

double CpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);  // all threads of this process: loop + console writer
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

bool CheckFile(const std::string& path, const std::string& block, uint64_t total) {
  std::string got, err;
  if (!ReadFile(path, &got, &err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return false;
  }
  if (got.size() != total) {
    std::fprintf(stderr, "%s: %zu bytes, want %llu\n", path.c_str(), got.size(),
                 static_cast<unsigned long long>(total));
    return false;
  }
  for (size_t pos = 0; pos < got.size(); pos += block.size()) {
    size_t n = std::min(block.size(), got.size() - pos);
    if (std::memcmp(got.data() + pos, block.data(), n) != 0) {
      std::fprintf(stderr, "%s: content differs near byte %zu\n", path.c_str(), pos);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int writers = 8, rounds = 3, mib = 32, read_kib = 64;
  std::string dir = "/tmp/dflash_log_bench", console_mode = "null";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--writers") writers = std::stoi(v);
    else if (k == "--mib") mib = std::stoi(v);
    else if (k == "--rounds") rounds = std::stoi(v);
    else if (k == "--dir") dir = v;
    else if (k == "--console") console_mode = v;
    else if (k == "--read-kib") read_kib = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s (see the top of log_bench.cc)\n", k.c_str());
      return 2;
    }
  }
  const uint64_t per_writer = static_cast<uint64_t>(mib) << 20;
  const std::string block = logtest::MakeLines(7, (1 << 20) / 100, 99, 99, false);  // as the writer makes it
  UniqueFd devnull(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  std::vector<double> rates;
  bool ok = true;
  for (int round = 0; round < rounds; ++round) {
    std::filesystem::remove_all(dir);
    std::unique_ptr<Console> console;
    if (console_mode != "none") {
      console = std::make_unique<Console>(
          Console::Options{.fd = console_mode == "stdout" ? 1 : devnull.get(), .color = ColorMode::kNever});
    }
    LogRouter router(console.get(), {.read_bytes = static_cast<size_t>(read_kib) << 10});
    std::vector<test::Process> children(writers);
    std::vector<int> ids;
    std::vector<std::string> paths;
    double cpu0 = CpuSeconds();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < writers; ++i) {
      std::string err;
      if (!test::StartProcess({.argv = {DFLASH_LOG_WRITER, "bench", std::to_string(per_writer)}}, &children[i], &err)) {
        std::fprintf(stderr, "%s\n", err.c_str());
        return 1;
      }
      paths.push_back(dir + "/run/attempt_0/w-" + std::to_string(i) + ".stdout.log");
      int out = router.Add(std::move(children[i].out), "w:" + std::to_string(i), false, paths.back(), &err);
      int er = router.Add(std::move(children[i].err), "w:" + std::to_string(i), true,
                          dir + "/run/attempt_0/w-" + std::to_string(i) + ".stderr.log", &err);
      if (out < 0 || er < 0) {
        std::fprintf(stderr, "%s\n", err.c_str());
        return 1;
      }
      ids.push_back(out);
      ids.push_back(er);
    }
    std::string err;
    if (!logtest::RunLoop(&router, ids, std::chrono::steady_clock::now() + std::chrono::minutes(10), &err)) {
      std::fprintf(stderr, "%s\n", err.c_str());
      return 1;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (console) console->Flush();
    double cpu = CpuSeconds() - cpu0;
    uint64_t dropped = 0;
    for (int id : ids) dropped += router.console_dropped(id);
    for (auto& c : children) test::WaitForExit(c.pid);
    for (const auto& p : paths) ok = CheckFile(p, block, per_writer) && ok;
    double mb = static_cast<double>(per_writer) * writers / 1e6;
    rates.push_back(mb / secs);
    std::printf("round %d: %.0f MB in %.3f s = %.0f MB/s; supervisor CPU %.2f s (%.0f%% of one core); "
                "console lines dropped %llu; files %s\n",
                round, mb, secs, mb / secs, cpu, 100 * cpu / secs, static_cast<unsigned long long>(dropped),
                ok ? "exact" : "WRONG");
  }
  std::sort(rates.begin(), rates.end());
  std::printf("median %.0f MB/s (%d writers x %d MiB of 100-byte lines, console %s, read %d KiB)\n",
              rates[rates.size() / 2], writers, mib, console_mode.c_str(), read_kib);
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}

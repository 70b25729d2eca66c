// A trivial payload for bench/supervisor/run_bench.py, the same under
// dflash-launch and torchrun (both set RANK):
//   bench_payload start DIR [sleep_ms]   write the CLOCK_REALTIME ns of main() to DIR/start.$RANK, sleep, exit 0
//   bench_payload die DIR RANK_TO_DIE MS  as start, but RANK_TO_DIE writes DIR/death and exits 1 after MS
//   bench_payload log MB [DIR]            write MB MiB (rounded up to whole lines) of 100-byte lines to
//                                         stdout, exit 0; with DIR, its start and end times in DIR/{start,end}.$RANK
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

static long long NowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Plain C on purpose: linked statically, the payload costs no dynamic loading,
// so what is measured is the launcher.
static void WriteNumber(const char* dir, const char* name, const char* suffix, long long v) {
  char path[4096], text[32];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
  int n = snprintf(text, sizeof text, "%lld\n", v);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, text, n);
    close(fd);
  }
}

int main(int argc, char** argv) {
  long long t = NowNs();
  const char* rank = getenv("RANK");
  if (argc >= 3 && (!strcmp(argv[1], "start") || !strcmp(argv[1], "die"))) {
    const char* dir = argv[2];
    WriteNumber(dir, "start.", rank ? rank : "x", t);
    if (!strcmp(argv[1], "die") && argc >= 5 && rank && !strcmp(rank, argv[3])) {
      usleep(atoi(argv[4]) * 1000);
      WriteNumber(dir, "death", "", NowNs());
      return 1;
    }
    int ms = !strcmp(argv[1], "start") && argc >= 4 ? atoi(argv[3]) : 600000;
    usleep(ms * 1000);
    return 0;
  }
  if (argc >= 3 && !strcmp(argv[1], "log")) {
    if (argc >= 4) WriteNumber(argv[3], "start.", rank ? rank : "x", t);
    long long total = atoll(argv[2]) << 20;
    char line[100];
    memset(line, 'x', sizeof line);
    line[99] = '\n';
    static char buf[1 << 16];
    size_t fill = 0;
    for (long long done = 0; done < total; done += 100) {
      memcpy(buf + fill, line, 100);
      fill += 100;
      if (fill + 100 > sizeof buf) {
        for (size_t off = 0; off < fill;) {
          ssize_t n = write(1, buf + off, fill - off);
          if (n <= 0) return 2;
          off += static_cast<size_t>(n);
        }
        fill = 0;
      }
    }
    for (size_t off = 0; off < fill;) {
      ssize_t n = write(1, buf + off, fill - off);
      if (n <= 0) return 2;
      off += static_cast<size_t>(n);
    }
    if (argc >= 4) WriteNumber(argv[3], "end.", rank ? rank : "x", NowNs());
    return 0;
  }
  fprintf(stderr, "usage: bench_payload start DIR [ms] | die DIR RANK MS | log MB [DIR]\n");
  return 64;
}

// Samples/s through the hidden-state spool, producer processes to consumer
// processes, against a plain copy of the same bytes through the same
// filesystem (write a file, read it back) measured in the same run.
//
//   spool_bench [--dir /dev/shm] [--mb 1] [--frames 2000] [--producers 1] [--consumers 1]
//               [--max-ready 16] [--repeat 3] [--consumer read|mmap]
//   spool_bench --consumer-only [--dir /dev/shm] [--mb 102.4] [--frames 20] [--repeat 3]
//
// The consumer maps each frame (safetensors::File::Map, as the builtin
// drafter does) and touches every byte; `--consumer read` reads it into a
// buffer instead (the drafter before issue #49). `--consumer-only`: one
// consumer's time per frame of an already published file -- Map and touch,
// Read -- against a memcpy of the frame's bytes, in the same run; then one
// producer and one consumer frame after frame, the spool's ring of reused
// files (spool_ring.h, map_cache.h) on and off.
//
// One JSON object per line on stdout (docs/benchmarks.md reads them).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "spool/map_cache.h"
#include "spool/spool.h"
#include "spool/spool_ring.h"

namespace {

using Clock = std::chrono::steady_clock;
using dflash::safetensors::TensorRef;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Args {
  std::string dir = "/dev/shm";
  double mb = 1;
  int frames = 2000, producers = 1, consumers = 1, max_ready = 16, repeat = 3;
  bool read = false, consumer_only = false;
};

/// What a drafter does with a frame's bytes at the least: reads each of them once.
uint64_t Touch(const uint8_t* p, size_t n) {
  uint64_t sum = 0, w = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::memcpy(&w, p + i, 8);
    sum += w;
  }
  for (; i < n; ++i) sum += p[i];
  return sum;
}

/// Consumes one frame file the way `a` says: mapped (views) or read (a copy), every byte touched.
bool Consume(const Args& a, const std::string& path, uint64_t* sum, std::string* err,
             std::shared_ptr<dflash::safetensors::MapCache> cache = nullptr) {
  dflash::safetensors::File file;
  if (!(a.read ? file.Read(path, err) : file.Map(path, err, cache))) return false;
  *sum += Touch(file.buffer().get(), file.size());
  return true;
}

/// The frame a producer publishes: "hidden" F32 of ~mb MiB and "tokens" I64, like a real frame.
struct Frame {
  std::vector<float> hidden;
  std::vector<int64_t> tokens;
  std::vector<TensorRef> refs;
  explicit Frame(double mb) {
    const int64_t seq = 512, width = std::max<int64_t>(1, static_cast<int64_t>(mb * (1 << 20)) / 4 / seq);
    hidden.assign(static_cast<size_t>(seq * width), 0.5f);
    tokens.assign(static_cast<size_t>(seq), 7);
    refs = {{"hidden", "F32", {1, seq, width}, hidden.data(), hidden.size() * 4},
            {"tokens", "I64", {1, seq}, tokens.data(), tokens.size() * 8}};
  }
  size_t FileBytes() const {
    std::string head, err;
    dflash::safetensors::EncodeHeader({{"producer", "target:0"}, {"seq", "0000000000"}}, refs, &head, &err);
    return head.size() + hidden.size() * 4 + tokens.size() * 8;
  }
};

void Fail(const std::string& what) {
  std::fprintf(stderr, "spool_bench: %s\n", what.c_str());
  std::exit(1);
}

/// The peer: write the same bytes to a file in `dir` and read them back, one
/// after the other in one process (what the spool's two processes do between them).
double PlainCopy(const Args& a, const Frame& f) {
  std::string path = a.dir + "/spool_bench_copy." + std::to_string(::getpid());
  std::vector<char> in(f.FileBytes());
  std::string head, err;
  dflash::safetensors::EncodeHeader({}, f.refs, &head, &err);
  auto t0 = Clock::now();
  for (int i = 0; i < a.frames; ++i) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || !dflash::safetensors::WriteFd(fd, {}, f.refs, &err)) Fail("copy write: " + err);
    ::close(fd);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    size_t got = 0;
    while (true) {
      ssize_t n = ::read(fd, in.data() + got, in.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  double s = Since(t0);
  ::unlink(path.c_str());
  return s;
}

double Spool(const Args& a, const Frame& f) {
  std::string root = a.dir + "/spool_bench." + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  std::vector<pid_t> kids;
  auto t0 = Clock::now();
  for (int p = 0; p < a.producers; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string err;
      dflash::spool::SpoolProducer prod(root, "target:" + std::to_string(p), a.max_ready);
      int n = a.frames / a.producers + (p < a.frames % a.producers);
      if (!prod.Open(&err)) Fail(err);
      for (int i = 0; i < n; ++i)
        if (!prod.Publish({}, f.refs, nullptr, &err)) Fail(err);
      _exit(prod.Finish(&err) ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (int c = 0; c < a.consumers; ++c) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string err;
      dflash::spool::SpoolConsumer con(root, "drafter:" + std::to_string(c), a.producers);
      auto maps = std::make_shared<dflash::safetensors::MapCache>();  // as the builtin drafter keeps them
      if (!con.Open(&err)) Fail(err);
      while (true) {
        dflash::spool::ClaimedFrame fr;
        bool end = false;
        if (!con.Next(&fr, &end, &err)) Fail(err);
        if (end) break;
        uint64_t sum = 0;  // every byte read, as a drafter does; the mapping gone before Ack truncates
        if (!Consume(a, fr.path, &sum, &err, maps) || !con.Ack(fr, &err)) Fail(err);
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) Fail("a bench process failed");
  }
  double s = Since(t0);
  nlohmann::ordered_json m;
  bool final = false;
  std::string err;
  if (!dflash::spool::Manifest(root, a.producers, &m, &final, &err) || !m["exactly_once"].get<bool>())
    Fail("the spool lost or duplicated frames: " + m.dump());
  std::filesystem::remove_all(root);
  return s;
}

/// One publish and one consume, frame after frame, through a spool in `dir` (one producer, one consumer, one
/// process), per frame: the ring on (the acknowledged file goes back to the producer, its mapping kept) and off
/// (as before the ring: each file truncated at the ack, each frame a new file and a new mapping), interleaved,
/// against a memcpy of the frame's bytes. Medians over `frames` after one frame of warm-up each.
void RingSteadyState(const Args& a, const Frame& f) {
  const size_t n = f.FileBytes();
  std::vector<uint8_t> src(n, 1), dst(n, 0);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Side {
    std::string root;
    dflash::spool::SpoolProducer prod;
    dflash::spool::SpoolConsumer con;
    std::shared_ptr<dflash::safetensors::MapCache> maps;
    std::vector<double> publish, consume;
  };
  auto make = [&](const std::string& tag, bool ring) {
    std::string root = a.dir + "/spool_bench_ring_" + tag + "." + std::to_string(::getpid());
    return Side{root, dflash::spool::SpoolProducer(root, "t:0", 1 << 20, int64_t{1} << 40),
                dflash::spool::SpoolConsumer(root, "d:0", 1),
                ring ? std::make_shared<dflash::safetensors::MapCache>() : nullptr, {}, {}};
  };
  Side on = make("on", true), off = make("off", false);
  std::string err;
  uint64_t sink = 0;
  for (Side* s : {&on, &off})
    if (!s->prod.Open(&err) || !s->con.Open(&err)) Fail(err);
  auto one = [&](Side& s, bool timed) {
    auto t0 = Clock::now();
    if (!s.prod.Publish({}, f.refs, nullptr, &err)) Fail(err);
    if (timed) s.publish.push_back(Since(t0));
    t0 = Clock::now();
    dflash::spool::ClaimedFrame fr;
    bool end = false;
    if (!s.con.Next(&fr, &end, &err) || end) Fail("no frame: " + err);
    if (!Consume(a, fr.path, &sink, &err, s.maps) || !s.con.Ack(fr, &err)) Fail(err);
    if (!s.maps) dflash::spool::DropFree(s.con.paths(), "t:0");  // the ring off: the ack's file goes
    if (timed) s.consume.push_back(Since(t0));
  };
  one(on, false);
  one(off, false);
  std::vector<double> copy;
  for (int i = 0; i < a.frames; ++i) {
    one(on, true);
    one(off, true);
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), n);
    sink += dst[i % n];
    copy.push_back(Since(t0));
  }
  const double cc = median(copy);
  std::printf("{\"ring\": true, \"frame_bytes\": %zu, \"frames\": %d, \"memcpy_ms\": %.2f, "
              "\"consume_ring_ms\": %.2f, \"consume_no_ring_ms\": %.2f, \"publish_ring_ms\": %.2f, "
              "\"publish_no_ring_ms\": %.2f, \"consume_ring_vs_memcpy\": %.2f, \"consume_no_ring_vs_memcpy\": %.2f, "
              "\"publish_ring_vs_memcpy\": %.2f, \"publish_no_ring_vs_memcpy\": %.2f, \"mappings_reused\": %d, "
              "\"sink\": %llu}\n",
              n, a.frames, cc * 1e3, median(on.consume) * 1e3, median(off.consume) * 1e3, median(on.publish) * 1e3,
              median(off.publish) * 1e3, median(on.consume) / cc, median(off.consume) / cc, median(on.publish) / cc,
              median(off.publish) / cc, on.maps->hits(), static_cast<unsigned long long>(sink % 10));
  std::fflush(stdout);
  std::filesystem::remove_all(on.root);
  std::filesystem::remove_all(off.root);
}

/// Per-frame seconds (medians over `frames`) of one consumer: Map + touch, Read + touch, and a memcpy of
/// the frame's bytes between two warm buffers.
void ConsumerOnly(const Args& a, const Frame& f) {
  std::string path = a.dir + "/spool_bench_frame." + std::to_string(::getpid()), err;
  if (!dflash::safetensors::WriteFile(path, {}, f.refs, &err)) Fail(err);
  const size_t n = f.FileBytes();
  std::vector<uint8_t> src(n, 1), dst(n, 0);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  uint64_t sink = 0;
  for (int r = 0; r < a.repeat; ++r) {
    std::vector<double> mapped, read, copy;
    for (int i = 0; i < a.frames; ++i) {  // interleaved: each sees the same load
      Args m = a, rd = a;
      m.read = false;
      rd.read = true;
      auto t0 = Clock::now();
      if (!Consume(m, path, &sink, &err)) Fail(err);
      mapped.push_back(Since(t0));
      t0 = Clock::now();
      if (!Consume(rd, path, &sink, &err)) Fail(err);
      read.push_back(Since(t0));
      t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), n);
      sink += dst[i % n];
      copy.push_back(Since(t0));
    }
    double mm = median(mapped), rr = median(read), cc = median(copy);
    std::printf("{\"frame_bytes\": %zu, \"frames\": %d, \"map_touch_ms\": %.2f, \"read_touch_ms\": %.2f, "
                "\"memcpy_ms\": %.2f, \"map_vs_memcpy\": %.2f, \"read_vs_memcpy\": %.2f, \"sink\": %llu}\n",
                n, a.frames, mm * 1e3, rr * 1e3, cc * 1e3, mm / cc, rr / cc,
                static_cast<unsigned long long>(sink % 10));
    std::fflush(stdout);
  }
  ::unlink(path.c_str());
  RingSteadyState(a, f);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--consumer-only") {
      a.consumer_only = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) Fail("option " + k + " needs a value");
    std::string v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--consumer" && (v == "read" || v == "mmap")) a.read = v == "read";
    else if (k == "--mb") a.mb = std::atof(v.c_str());
    else if (k == "--frames") a.frames = std::atoi(v.c_str());
    else if (k == "--producers") a.producers = std::atoi(v.c_str());
    else if (k == "--consumers") a.consumers = std::atoi(v.c_str());
    else if (k == "--max-ready") a.max_ready = std::atoi(v.c_str());
    else if (k == "--repeat") a.repeat = std::atoi(v.c_str());
    else Fail("unknown option " + k);
  }
  Frame f(a.mb);
  if (a.consumer_only) {
    ConsumerOnly(a, f);
    return 0;
  }
  const double bytes = static_cast<double>(f.FileBytes());
  for (int r = 0; r < a.repeat; ++r) {
    // Interleaved, so both see the same machine (2 shared cores: the load moves).
    double copy_s = PlainCopy(a, f);
    double spool_s = Spool(a, f);
    double copy_gbs = bytes * a.frames / copy_s / 1e9, spool_gbs = bytes * a.frames / spool_s / 1e9;
    std::printf(
        "{\"frame_bytes\": %.0f, \"frames\": %d, \"producers\": %d, \"consumers\": %d, \"max_ready\": %d, "
        "\"consumer\": \"%s\", \"copy_s\": %.4f, \"copy_GBps\": %.3f, \"spool_s\": %.4f, \"spool_frames_per_s\": %.1f, "
        "\"spool_GBps\": %.3f, \"ratio\": %.3f}\n",
        bytes, a.frames, a.producers, a.consumers, a.max_ready, a.read ? "read" : "mmap", copy_s, copy_gbs, spool_s, a.frames / spool_s,
        spool_gbs, spool_gbs / copy_gbs);
    std::fflush(stdout);
  }
  return 0;
}

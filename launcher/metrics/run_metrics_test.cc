// RunMetrics against real values: the registry's text for a snapshot, counters that only go up, the exposer on a
// real loopback socket (close-on-exec), /proc of this process and a spool laid out as the producers lay it out.
#include "launcher/metrics/run_metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "launcher/config/metrics_address.h"
#include "launcher/metrics/proc_sample.h"
#include "launcher/metrics/spool_count.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

ProcessSnapshot Proc(const std::string& name, const std::string& state, int exit_restarts = 0) {
  ProcessSnapshot p;
  p.name = name;
  p.role = name.substr(0, name.find(':'));
  p.state = state;
  p.up = state == "RUNNING";
  p.pid = ::getpid();
  p.attempt = exit_restarts;
  for (const char* r : kRestartReasons) p.restarts[r] = 0;
  p.restarts["exit"] = exit_restarts;
  return p;
}

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(RunMetrics, TextCarriesEveryProcessAndCountsRestartsOnce) {
  RunMetrics m;
  RunSnapshot s;
  s.run_id = "r1";
  s.node = "0";
  s.uptime_s = 5;
  s.processes = {Proc("drafter:0", "RUNNING", 2), Proc("target:0", "BACKOFF")};
  s.processes[1].last_exit_code = 3;
  s.processes[0].gate_wait_s = 1.5;
  s.processes[0].gate_role = "reuse";
  s.processes[0].metrics = {{"steps", 10}, {"last_loss", 2.25}, {"wall_s", 12.0}, {"time_to_first_step_s", 3.0},
                            {"fxgraph_cache_hit", 4}, {"fxgraph_cache_miss", 1}};
  m.Update(s);
  std::string t = m.Text();
  EXPECT_TRUE(Has(t, "dflash_run_info{node=\"0\",run=\"r1\"} 1")) << t;
  EXPECT_TRUE(Has(t, "dflash_process_up{process=\"drafter:0\",role=\"drafter\"} 1")) << t;
  EXPECT_TRUE(Has(t, "dflash_process_up{process=\"target:0\",role=\"target\"} 0")) << t;
  EXPECT_TRUE(Has(t, "dflash_process_state{process=\"target:0\",role=\"target\",state=\"BACKOFF\"} 1")) << t;
  EXPECT_TRUE(Has(t, "dflash_process_state{process=\"target:0\",role=\"target\",state=\"RUNNING\"} 0")) << t;
  EXPECT_TRUE(Has(t, "dflash_restarts_total{process=\"drafter:0\",reason=\"exit\",role=\"drafter\"} 2")) << t;
  // Every reason is there from the start at 0, so increase() sees the first restart.
  EXPECT_TRUE(Has(t, "dflash_restarts_total{process=\"target:0\",reason=\"hung\",role=\"target\"} 0")) << t;
  EXPECT_TRUE(Has(t, "dflash_process_last_exit_code{process=\"target:0\",role=\"target\"} 3")) << t;
  EXPECT_EQ(t.find("dflash_process_last_exit_code{process=\"drafter:0\""), std::string::npos) << "no exit yet";
  EXPECT_TRUE(Has(t, "dflash_gate_wait_seconds{process=\"drafter:0\",role=\"drafter\"} 1.5")) << t;
  EXPECT_TRUE(Has(t, "dflash_gate_leader{process=\"drafter:0\",role=\"drafter\"} 0")) << t;
  EXPECT_TRUE(Has(t, "dflash_compile_cache_hits{cache=\"fxgraph\",process=\"drafter:0\",role=\"drafter\"} 4")) << t;
  EXPECT_TRUE(Has(t, "dflash_training_steps{process=\"drafter:0\",role=\"drafter\"} 10")) << t;
  EXPECT_TRUE(Has(t, "dflash_training_loss{process=\"drafter:0\",role=\"drafter\"} 2.25")) << t;
  // (12 - 3) / (10 - 1): the mean after the first step, before two readings exist.
  EXPECT_TRUE(Has(t, "dflash_training_step_seconds{process=\"drafter:0\",role=\"drafter\"} 1")) << t;
  EXPECT_NE(t.find("# TYPE dflash_restarts_total counter"), std::string::npos);

  // The same history again counts nothing; one more restart counts one.
  m.Update(s);
  s.processes[0].restarts["exit"] = 3;
  s.processes[0].metrics["steps"] = 20;
  s.processes[0].metrics["wall_s"] = 17.0;
  m.Update(s);
  t = m.Text();
  EXPECT_TRUE(Has(t, "dflash_restarts_total{process=\"drafter:0\",reason=\"exit\",role=\"drafter\"} 3")) << t;
  // Between the two readings: (17 - 12) / (20 - 10).
  EXPECT_TRUE(Has(t, "dflash_training_step_seconds{process=\"drafter:0\",role=\"drafter\"} 0.5")) << t;
}

TEST(RunMetrics, ResumeShowsTheGlobalStepTheResumePointAndTheCheckpoint) {
  RunMetrics m;
  RunSnapshot s;
  s.unix_now = 1000;
  s.processes = {Proc("drafter:0", "RUNNING"), Proc("target:0", "RUNNING")};
  // What dflash_launch.Checkpoint writes after a resume from step 20 and 5 steps since, one commit at 990.
  s.processes[0].metrics = {{"steps", 5}, {"resumed_from_step", 20}, {"last_checkpoint_unix", 990.0},
                            {"checkpoint", {{"path", "/c/step-0000000024"}, {"step", 24}}}};
  s.processes[1].metrics = {{"steps", 7}};  // no checkpoints: no resume series at all
  m.Update(s);
  std::string t = m.Text();
  EXPECT_TRUE(Has(t, "dflash_training_global_step{process=\"drafter:0\",role=\"drafter\"} 25")) << t;
  EXPECT_TRUE(Has(t, "dflash_training_resumed_from_step{process=\"drafter:0\",role=\"drafter\"} 20")) << t;
  EXPECT_TRUE(Has(t, "dflash_training_checkpoint_step{process=\"drafter:0\",role=\"drafter\"} 24")) << t;
  EXPECT_TRUE(Has(t, "dflash_training_checkpoint_age_seconds{process=\"drafter:0\",role=\"drafter\"} 10")) << t;
  EXPECT_EQ(t.find("dflash_training_global_step{process=\"target:0\""), std::string::npos) << t;
  // The file's own global_step wins (a loop whose steps are not the metrics' steps).
  s.processes[0].metrics["global_step"] = 31;
  m.Update(s);
  EXPECT_TRUE(Has(m.Text(), "dflash_training_global_step{process=\"drafter:0\",role=\"drafter\"} 31"));
}

TEST(RunMetrics, CpuOfThisProcessOnlyGoesUp) {
  RunMetrics m;
  RunSnapshot s;
  s.processes = {Proc("a:0", "RUNNING")};
  m.Update(s);
  volatile double x = 0;
  for (int i = 0; i < 30'000'000; ++i) x = x + i;  // burn some CPU between two readings
  m.Update(s);
  std::string t = m.Text();
  size_t at = t.find("dflash_process_cpu_seconds_total{process=\"a:0\",role=\"a\"} ");
  ASSERT_NE(at, std::string::npos) << t;
  double cpu = std::strtod(t.c_str() + t.find("} ", at) + 2, nullptr);
  ProcSample self;
  ASSERT_TRUE(SampleProc(::getpid(), &self));
  EXPECT_GT(cpu, 0);
  EXPECT_LE(cpu, self.cpu_s);
  EXPECT_GT(self.rss_bytes, 1 << 20);
  ProcSample none;
  EXPECT_FALSE(SampleProc(0, &none));
}

/// GET /metrics over a plain socket: the body, or "" on failure.
std::string HttpGet(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(RunMetrics, ServesOnLoopbackWithACloseOnExecSocket) {
  RunMetrics m;
  std::string err;
  ASSERT_TRUE(m.Serve("127.0.0.1:0", &err)) << err;
  ASSERT_EQ(m.url().rfind("http://127.0.0.1:", 0), 0u) << m.url();
  int port = std::atoi(m.url().c_str() + std::string("http://127.0.0.1:").size());
  ASSERT_GT(port, 0);
  RunSnapshot s;
  s.processes = {Proc("a:0", "RUNNING", 1)};
  m.Update(s);
  std::string body = HttpGet(port);
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("dflash_restarts_total{process=\"a:0\",reason=\"exit\",role=\"a\"} 1"), std::string::npos)
      << body;
  // Every socket this process holds (the exposer's listening one among them) is close-on-exec: a payload
  // forked and executed now would not inherit it.
  int sockets = 0;
  DIR* d = ::opendir("/proc/self/fd");
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    int fd = std::atoi(e->d_name);
    char target[256] = {};
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(link.c_str(), target, sizeof target - 1) <= 0) continue;
    if (std::string(target).rfind("socket:", 0) != 0) continue;
    ++sockets;
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "socket fd " << fd << " is inherited by children";
  }
  ::closedir(d);
  EXPECT_GE(sockets, 1);

  // A client that connects and says nothing does not hold the scrapes up: another GET is answered while it still
  // holds its connection.
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_NE(HttpGet(port).find("200 OK"), std::string::npos);
  char byte;
  EXPECT_EQ(::recv(silent, &byte, 1, MSG_DONTWAIT), -1) << "the silent client was dropped before the scrape";
  ::close(silent);

  // The port is taken now: a second exposer on it is refused with the address in words.
  RunMetrics second;
  std::string taken = "127.0.0.1:" + std::to_string(port);
  EXPECT_FALSE(second.Serve(taken, &err));
  EXPECT_NE(err.find(taken), std::string::npos) << err;
  EXPECT_EQ(second.url(), "");
}

bool Refused(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool refused = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno == ECONNREFUSED;
  ::close(fd);
  return refused;
}

// civetweb's stop waits for its master thread's poll() on the listening socket, which ends after 2 s when no
// scrape comes: every run ended that much late (a run whose only process failed at exec took 2.03 s, now 0.04 s).
// Stopping right after serving is its worst case; loopback and the wildcard (woken through loopback) both stop
// in a fraction of that, and the port is closed after.
TEST(RunMetrics, StopsServingWithoutWaitingForCivetwebsPoll) {
  for (const char* address : {"127.0.0.1:0", "0.0.0.0:0"}) {
    auto m = std::make_unique<RunMetrics>();
    std::string err;
    ASSERT_TRUE(m->Serve(address, &err)) << err;
    int port = std::atoi(m->url().c_str() + m->url().rfind(':') + 1);
    ASSERT_GT(port, 0) << m->url();
    auto t0 = std::chrono::steady_clock::now();
    m.reset();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 1.0) << address;
    EXPECT_TRUE(Refused(port)) << address;
  }
}

TEST(SpoolCount, CountsFramesByTheDirectoryTheyAreIn) {
  fs::path root = fs::temp_directory_path() / ("spool_count_test_" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const char* d : {"tmp", "ready", "claimed/c0", "claimed/c1", "done", "rejected", "producers"})
    fs::create_directories(root / d);
  auto touch = [&](const std::string& rel) { std::ofstream(root / rel) << "x"; };
  touch("tmp/t0-0000000009.safetensors.tmp.1");
  touch("ready/t0-0000000003.safetensors");
  touch("ready/t0-0000000004.safetensors");
  touch("ready/t0-0000000004.reason");  // not a frame
  touch("claimed/c0/t0-0000000002.safetensors");
  touch("claimed/c1/t1-0000000002.safetensors");
  touch("done/t0-0000000001.safetensors");
  std::filesystem::create_directories(root / "pending/c0");
  touch("pending/c0/0000000004.t0-0000000000.safetensors");
  touch("pending/c0/0000000005.t1-0000000000.safetensors");
  touch("rejected/t1-0000000001.safetensors");
  touch("rejected/t1-0000000001.safetensors.reason");
  touch("producers/t0.done");
  SpoolCounts c = CountSpool(root.string());
  EXPECT_TRUE(c.present);
  EXPECT_EQ(c.writing, 1);
  EXPECT_EQ(c.pending, 2);
  EXPECT_EQ(c.ready, 2);
  EXPECT_EQ(c.claimed, 2);
  EXPECT_EQ(c.done, 1);
  EXPECT_EQ(c.rejected, 1);

  RunMetrics m;
  RunSnapshot s;
  s.spool_dir = root.string();
  s.uptime_s = 1;
  m.Update(s);
  touch("done/t0-0000000002.safetensors");
  touch("done/t0-0000000003.safetensors");
  s.uptime_s = 3;
  m.Update(s);
  std::string t = m.Text();
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"ready\"} 2")) << t;
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"writing\"} 1")) << t;
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"pending\"} 2")) << t;
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"done\"} 3")) << t;
  EXPECT_TRUE(Has(t, "dflash_spool_frames_per_second 1")) << t;  // 2 frames in 2 s

  // done/ is listed again only after 100 times what its last listing took: right after one, the count stays; a
  // while later (1000 s here) it is listed again. The other states are counted every time.
  s.uptime_s = 1000;
  m.Update(s);
  touch("done/t0-0000000004.safetensors");
  touch("ready/t0-0000000005.safetensors");
  s.uptime_s = 1000.000001;
  m.Update(s);
  t = m.Text();
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"done\"} 3")) << t;
  EXPECT_TRUE(Has(t, "dflash_spool_frames{state=\"ready\"} 3")) << t;
  s.uptime_s = 2000;
  m.Update(s);
  EXPECT_TRUE(Has(m.Text(), "dflash_spool_frames{state=\"done\"} 4")) << m.Text();
  EXPECT_EQ(CountSpool(root.string(), false).done, 0);
  fs::remove_all(root);
  EXPECT_FALSE(CountSpool(root.string()).present);
}

TEST(MetricsAddress, TakesIpAndPortAndSaysWhatIsWrong) {
  std::string err;
  EXPECT_TRUE(ValidMetricsAddress("127.0.0.1:0", &err));
  EXPECT_TRUE(ValidMetricsAddress("0.0.0.0:9400", &err));
  EXPECT_TRUE(ValidMetricsAddress("[::1]:9400", &err));
  EXPECT_FALSE(ValidMetricsAddress("localhost:9400", &err));
  EXPECT_NE(err.find("not an IPv4 address"), std::string::npos) << err;
  EXPECT_FALSE(ValidMetricsAddress("127.0.0.1", &err));
  EXPECT_NE(err.find("no port"), std::string::npos) << err;
  EXPECT_FALSE(ValidMetricsAddress("127.0.0.1:65536", &err));
  EXPECT_FALSE(ValidMetricsAddress("127.0.0.1:-1", &err));
  EXPECT_FALSE(ValidMetricsAddress("[::1:9400", &err));
}

}  // namespace
}  // namespace dflash

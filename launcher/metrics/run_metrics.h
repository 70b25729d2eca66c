// A live run's Prometheus metrics (docs/metrics.md): one registry (prometheus-cpp), filled on the supervisor's
// loop thread from a RunSnapshot, served on GET /metrics by prometheus-cpp's exposer (civetweb), whose threads
// only read the registry -- they never touch the supervisor's state. `ctl metrics` gets the same text through
// the control socket (Text()).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "launcher/metrics/run_snapshot.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace dflash {

/// civetweb's workers that answer scrapes, and how long one waits for a client's request before it drops the
/// connection (run_metrics.cc says why; docs/metrics.md, "How it is built").
inline constexpr int kMetricsWorkers = 8;
inline constexpr int kMetricsRequestTimeoutMs = 1000;

class RunMetrics {
 public:
  RunMetrics();
  ~RunMetrics();
  RunMetrics(const RunMetrics&) = delete;
  RunMetrics& operator=(const RunMetrics&) = delete;

  /// False in a build without prometheus-cpp (the wheel's portable build: run_metrics_off.cc).
  static bool Available();

  /// Serves GET /metrics on `address` (metrics_address.h) from threads of the exposer's own; false with
  /// `err` if it cannot bind. REQUIRES: the caller's signals are blocked (its threads inherit the mask).
  /// The listening socket is close-on-exec (civetweb sets FD_CLOEXEC; tests/test_metrics.py checks a
  /// payload does not hold it).
  bool Serve(const std::string& address, std::string* err);
  /// "http://IP:PORT/metrics" while serving, else "".
  const std::string& url() const { return url_; }

  /// Every value from `s`, plus what it reads itself: /proc of each process (CPU, RSS) and the spool's
  /// directories. Loop thread only. A scrape during an update may see some of its values and not yet others.
  void Update(const RunSnapshot& s);

  /// The text exposition (format 0.0.4) of everything registered: what GET /metrics answers.
  std::string Text() const;

 private:
  struct ProcessSeries;
  ProcessSeries& SeriesOf(const ProcessSnapshot& p);
  void UpdateProcess(const ProcessSnapshot& p, double unix_now);
  void UpdateSpool(const RunSnapshot& s);

  void StopServing();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
  std::string wake_host_;  // where a connect reaches the listening socket (StopServing)
  int wake_port_ = 0;
  struct Families;
  std::unique_ptr<Families> f_;
  std::map<std::string, std::unique_ptr<ProcessSeries>> procs_;
  // The spool's acknowledged frames at the last listing of done/, for frames/s; done/ is listed again no sooner
  // than 100 times what its last listing took (at most 1% of the loop's time, however many frames it holds).
  int64_t last_done_ = -1;
  double last_done_at_ = 0;
  double next_done_at_ = 0;
};

}  // namespace dflash

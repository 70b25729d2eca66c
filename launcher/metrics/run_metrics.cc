#include "launcher/metrics/run_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <thread>

#include "common/net_probe.h"
#include "launcher/metrics/proc_sample.h"
#include "launcher/metrics/spool_count.h"

namespace dflash {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using Labels = std::map<std::string, std::string>;

namespace {

/// The process states as ProcStateName spells them (launcher/supervise/process_unit.h): one series each, 1 for
/// the current one, so `dflash_process_state{state="BACKOFF"} == 1` selects what is in backoff.
constexpr const char* kStates[] = {"NOT_STARTED", "WAITING", "FAILED",  "STARTING", "RUNNING",
                                   "BACKOFF",     "STOPPING", "EXITED", "FATAL"};

/// The compile caches whose counters a metrics file carries (torch._dynamo.utils.counters, as
/// dflash_launch.train_metrics and the builtin roles write them): <cache>_cache_hit / _miss.
constexpr const char* kCaches[] = {"fxgraph", "autograd"};

bool Number(const nlohmann::json& j, const char* key, double* out) {
  if (!j.is_object()) return false;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return true;
}

/// The IP literal a connect to a socket listening on `host` ("IP" or "[IPv6]") reaches it at: loopback for a
/// wildcard.
std::string WakeHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "0.0.0.0") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

}  // namespace

struct RunMetrics::Families {
  explicit Families(prometheus::Registry& r)
      : run_info(G(r, "dflash_run_info", "The run this launcher supervises (value 1): run id and node index.")),
        run_uptime(G(r, "dflash_run_uptime_seconds", "Seconds since the launcher began the run.")),
        run_stopping(G(r, "dflash_run_stopping", "1 once the run is stopping (a failure, a signal, ctl stop all).")),
        up(G(r, "dflash_process_up", "1 while the process is RUNNING (ready), else 0.")),
        state(G(r, "dflash_process_state", "1 for the state the process is in, 0 for the others.")),
        restarts(C(r, "dflash_restarts_total", "Restarts of the process, by why (docs/metrics.md).")),
        attempt(G(r, "dflash_process_attempt", "The process's current attempt (spawns so far - 1).")),
        exit_code(G(r, "dflash_process_last_exit_code",
                    "Exit code of the process's last ended attempt (128+N for signal N).")),
        uptime(G(r, "dflash_process_uptime_seconds", "Seconds since this attempt started; 0 when not running.")),
        cpu(C(r, "dflash_process_cpu_seconds_total",
              "User and system CPU seconds of the process (its payload under dflash-worker), all attempts.")),
        rss(G(r, "dflash_process_resident_memory_bytes", "Resident memory of the process (its payload), bytes.")),
        gate_wait(G(r, "dflash_gate_wait_seconds", "Time the last attempt waited for the compile gate.")),
        compile(G(r, "dflash_gate_compile_seconds", "The gate leader's spawn to READY (its compile), last attempt.")),
        gate_leader(G(r, "dflash_gate_leader", "1 if the last attempt led its compile gate, 0 if it reused.")),
        cache_hits(G(r, "dflash_compile_cache_hits", "Inductor cache hits of the current attempt, by cache.")),
        cache_misses(G(r, "dflash_compile_cache_misses", "Inductor cache misses of the current attempt, by cache.")),
        steps(G(r, "dflash_training_steps", "Training steps of the current attempt (its metrics file).")),
        loss(G(r, "dflash_training_loss", "The last training loss the process reported.")),
        step_time(G(r, "dflash_training_step_seconds",
                    "Seconds per training step, between the last two metrics-file updates.")),
        checkpoint_age(G(r, "dflash_training_checkpoint_age_seconds",
                         "Seconds since the process's last checkpoint (metrics key last_checkpoint_unix).")),
        global_step(G(r, "dflash_training_global_step",
                      "The training step across attempts: the step resumed from plus the steps since.")),
        resumed_from(G(r, "dflash_training_resumed_from_step",
                       "The checkpoint step the current attempt resumed from (0: it found none).")),
        checkpoint_step(G(r, "dflash_training_checkpoint_step", "The step of the process's last checkpoint.")),
        spool_frames(G(r, "dflash_spool_frames", "Frames in the run's spool by state (pending, ready, claimed, "
                                                   "done, rejected).")),
        spool_rate(G(r, "dflash_spool_frames_per_second", "Frames acknowledged (moved to done) per second, "
                                                           "between the last two updates.")) {}

  static Family<Gauge>& G(prometheus::Registry& r, const char* name, const char* help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(r);
  }
  static Family<Counter>& C(prometheus::Registry& r, const char* name, const char* help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  }

  Family<Gauge>& run_info;
  Family<Gauge>& run_uptime;
  Family<Gauge>& run_stopping;
  Family<Gauge>& up;
  Family<Gauge>& state;
  Family<Counter>& restarts;
  Family<Gauge>& attempt;
  Family<Gauge>& exit_code;
  Family<Gauge>& uptime;
  Family<Counter>& cpu;
  Family<Gauge>& rss;
  Family<Gauge>& gate_wait;
  Family<Gauge>& compile;
  Family<Gauge>& gate_leader;
  Family<Gauge>& cache_hits;
  Family<Gauge>& cache_misses;
  Family<Gauge>& steps;
  Family<Gauge>& loss;
  Family<Gauge>& step_time;
  Family<Gauge>& checkpoint_age;
  Family<Gauge>& global_step;
  Family<Gauge>& resumed_from;
  Family<Gauge>& checkpoint_step;
  Family<Gauge>& spool_frames;
  Family<Gauge>& spool_rate;
};

/// One process's series and what the next update needs of the last one. Series that have no value yet (an
/// exit code before any exit, a loss before any step) are added when the first value comes.
struct RunMetrics::ProcessSeries {
  Labels labels;
  Gauge* up = nullptr;
  std::map<std::string, Gauge*> state;
  std::map<std::string, Counter*> restarts;
  std::map<std::string, int> restarts_seen;
  Gauge* attempt = nullptr;
  Gauge* uptime = nullptr;
  Counter* cpu = nullptr;
  Gauge* rss = nullptr;
  // Lazily added (AddOnce).
  Gauge* exit_code = nullptr;
  Gauge* gate_wait = nullptr;
  Gauge* compile = nullptr;
  Gauge* gate_leader = nullptr;
  std::map<std::string, Gauge*> hits, misses;
  Gauge* steps = nullptr;
  Gauge* loss = nullptr;
  Gauge* step_time = nullptr;
  Gauge* checkpoint_age = nullptr;
  Gauge* global_step = nullptr;
  Gauge* resumed_from = nullptr;
  Gauge* checkpoint_step = nullptr;
  // The CPU counter's last reading: of which process (pid, start) and how much it had used.
  pid_t cpu_pid = -1;
  uint64_t cpu_start = 0;
  double cpu_last = 0;
  // The metrics file's last (steps, wall_s) of which attempt, for the step time.
  int steps_attempt = -1;
  double steps_last = -1, wall_last = -1;
};

RunMetrics::RunMetrics()
    : registry_(std::make_shared<prometheus::Registry>()), f_(std::make_unique<Families>(*registry_)) {}

RunMetrics::~RunMetrics() { StopServing(); }

// civetweb's mg_stop (the exposer's destructor) sets a flag and waits for its master thread, which reads the flag
// only when its poll() on the listening socket returns: with no scrape coming, after up to 2 s (civetweb's
// SOCKET_TIMEOUT_QUANTUM), added to the end of every run. A connection to that socket wakes it at once, so a
// thread of ours connects every few ms until the exposer is gone; a refused connect (the socket already closed)
// costs nothing.
void RunMetrics::StopServing() {
  if (!exposer_) return;
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load()) {
      NetProbe().Start(wake_host_, wake_port_, "", 0);  // a non-blocking connect, dropped at once
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();
  stopped.store(true);
  waker.join();
}

bool RunMetrics::Available() { return true; }

bool RunMetrics::Serve(const std::string& address, std::string* err) {
  try {
    // Any local user can connect to a loopback port, and every client of it comes from 127.0.0.1 (no per-peer
    // cap can tell a Prometheus from a squatter). A client that connects and says nothing holds one of civetweb's
    // workers until its request timeout: with 2 workers and 10 s, two idle connections stopped every scrape. A
    // scrape's GET comes in one packet, so 1 s is plenty to wait for it; 8 workers leave a worker free for up to
    // 7 idle connections, and more than that delay a scrape by about a second per 8 of them, never for good.
    // No keep-alive: a worker is never parked on a client between its requests.
    exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", std::to_string(kMetricsWorkers), "request_timeout_ms",
        std::to_string(kMetricsRequestTimeoutMs), "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    *err = "cannot serve metrics on " + address + ": " + e.what();
    return false;
  }
  exposer_->RegisterCollectable(registry_);
  std::vector<int> ports = exposer_->GetListeningPorts();
  if (ports.empty()) {
    exposer_.reset();
    *err = "cannot serve metrics on " + address + ": no listening port";
    return false;
  }
  std::string host = address.substr(0, address.rfind(':'));
  url_ = "http://" + host + ":" + std::to_string(ports[0]) + "/metrics";
  wake_host_ = WakeHost(host);
  wake_port_ = ports[0];
  return true;
}

std::string RunMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

RunMetrics::ProcessSeries& RunMetrics::SeriesOf(const ProcessSnapshot& p) {
  std::unique_ptr<ProcessSeries>& slot = procs_[p.name];
  if (slot) return *slot;
  slot = std::make_unique<ProcessSeries>();
  ProcessSeries& s = *slot;
  s.labels = {{"role", p.role}, {"process", p.name}};
  auto with = [&](const char* key, const std::string& value) {
    Labels l = s.labels;
    l[key] = value;
    return l;
  };
  s.up = &f_->up.Add(s.labels);
  for (const char* st : kStates) s.state[st] = &f_->state.Add(with("state", st));
  for (const char* r : kRestartReasons) s.restarts[r] = &f_->restarts.Add(with("reason", r));
  s.attempt = &f_->attempt.Add(s.labels);
  s.uptime = &f_->uptime.Add(s.labels);
  s.cpu = &f_->cpu.Add(s.labels);
  s.rss = &f_->rss.Add(s.labels);
  return s;
}

void RunMetrics::Update(const RunSnapshot& s) {
  f_->run_info.Add({{"run", s.run_id}, {"node", s.node}}).Set(1);
  f_->run_uptime.Add({}).Set(s.uptime_s);
  f_->run_stopping.Add({}).Set(s.stopping ? 1 : 0);
  for (const ProcessSnapshot& p : s.processes) UpdateProcess(p, s.unix_now);
  UpdateSpool(s);
}

void RunMetrics::UpdateProcess(const ProcessSnapshot& p, double unix_now) {
  ProcessSeries& s = SeriesOf(p);
  auto add_once = [&](Gauge*& g, Family<Gauge>& family, const Labels& labels) -> Gauge& {
    if (!g) g = &family.Add(labels);
    return *g;
  };
  s.up->Set(p.up ? 1 : 0);
  for (auto& [name, g] : s.state) g->Set(name == p.state ? 1 : 0);
  for (auto& [reason, counter] : s.restarts) {
    auto it = p.restarts.find(reason);
    int now = it == p.restarts.end() ? 0 : it->second;
    int& seen = s.restarts_seen[reason];
    if (now > seen) counter->Increment(now - seen);
    seen = std::max(seen, now);
  }
  s.attempt->Set(p.attempt);
  s.uptime->Set(p.uptime_s);
  if (p.last_exit_code) add_once(s.exit_code, f_->exit_code, s.labels).Set(*p.last_exit_code);

  // CPU and memory from /proc. The counter takes what was used since the last reading of the same process
  // (pid and start time); a new process (a restart, the payload's pid once claimed) adds all it has used.
  ProcSample ps;
  if (p.pid > 0 && SampleProc(p.pid, &ps)) {
    bool same = ps.start_ticks == s.cpu_start && p.pid == s.cpu_pid;
    double used = same ? ps.cpu_s - s.cpu_last : ps.cpu_s;
    if (used > 0) s.cpu->Increment(used);
    s.cpu_pid = p.pid;
    s.cpu_start = ps.start_ticks;
    s.cpu_last = ps.cpu_s;
    s.rss->Set(static_cast<double>(ps.rss_bytes));
  } else if (!p.up) {
    s.rss->Set(0);
  }

  if (p.gate_wait_s) add_once(s.gate_wait, f_->gate_wait, s.labels).Set(*p.gate_wait_s);
  if (p.compile_s) add_once(s.compile, f_->compile, s.labels).Set(*p.compile_s);
  if (p.gate_role) add_once(s.gate_leader, f_->gate_leader, s.labels).Set(*p.gate_role == "lead" ? 1 : 0);

  const nlohmann::json& m = p.metrics;
  double v;
  for (const char* cache : kCaches) {
    Labels l = s.labels;
    l["cache"] = cache;
    if (Number(m, (std::string(cache) + "_cache_hit").c_str(), &v))
      add_once(s.hits[cache], f_->cache_hits, l).Set(v);
    if (Number(m, (std::string(cache) + "_cache_miss").c_str(), &v))
      add_once(s.misses[cache], f_->cache_misses, l).Set(v);
  }
  double steps = 0, wall = 0;
  if (Number(m, "steps", &steps)) {
    add_once(s.steps, f_->steps, s.labels).Set(steps);
    // Step time: between two readings of this attempt's file, else the mean after the first step.
    double step_s = -1;
    bool has_wall = Number(m, "wall_s", &wall);
    if (Number(m, "step_time_s", &v)) {
      step_s = v;
    } else if (has_wall && s.steps_attempt == p.attempt && steps > s.steps_last && s.steps_last >= 0) {
      step_s = (wall - s.wall_last) / (steps - s.steps_last);
    } else if (has_wall && steps > 1 && Number(m, "time_to_first_step_s", &v)) {
      step_s = (wall - v) / (steps - 1);
    }
    if (step_s >= 0) add_once(s.step_time, f_->step_time, s.labels).Set(step_s);
    if (has_wall && (s.steps_attempt != p.attempt || steps != s.steps_last)) {
      s.steps_attempt = p.attempt;
      s.steps_last = steps;
      s.wall_last = wall;
    }
  }
  if (Number(m, "last_loss", &v)) add_once(s.loss, f_->loss, s.labels).Set(v);
  if (Number(m, "last_checkpoint_unix", &v) && unix_now > 0)
    add_once(s.checkpoint_age, f_->checkpoint_age, s.labels).Set(std::max(0.0, unix_now - v));
  // Resume, across attempts: a process that checkpoints says where it resumed (dflash_launch.Checkpoint, the
  // builtin drafter); its global step is that plus this attempt's steps (the file's own `global_step` wins).
  double resumed = 0;
  if (Number(m, "resumed_from_step", &resumed)) {
    add_once(s.resumed_from, f_->resumed_from, s.labels).Set(resumed);
    double global = -1;
    if (Number(m, "global_step", &v))
      global = v;
    else if (Number(m, "steps", &v))
      global = resumed + v;
    if (global >= 0) add_once(s.global_step, f_->global_step, s.labels).Set(global);
  }
  if (m.is_object()) {
    auto it = m.find("checkpoint");  // {path, step} of the last one committed (or restored)
    if (it != m.end() && Number(*it, "step", &v)) add_once(s.checkpoint_step, f_->checkpoint_step, s.labels).Set(v);
  }
}

void RunMetrics::UpdateSpool(const RunSnapshot& s) {
  if (s.spool_dir.empty()) return;
  const bool with_done = s.uptime_s >= next_done_at_;
  auto t0 = std::chrono::steady_clock::now();
  SpoolCounts c = CountSpool(s.spool_dir, with_done);
  if (!c.present) return;
  for (auto [state, n] : {std::pair{"writing", c.writing}, {"ready", c.ready}, {"claimed", c.claimed},
                          {"pending", c.pending}, {"rejected", c.rejected}})
    f_->spool_frames.Add({{"state", state}}).Set(static_cast<double>(n));
  if (!with_done) return;  // done and frames/s keep their last values
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  next_done_at_ = s.uptime_s + 100 * took;
  f_->spool_frames.Add({{"state", "done"}}).Set(static_cast<double>(c.done));
  if (last_done_ >= 0 && s.uptime_s > last_done_at_ && c.done >= last_done_)
    f_->spool_rate.Add({}).Set(static_cast<double>(c.done - last_done_) / (s.uptime_s - last_done_at_));
  else
    f_->spool_rate.Add({}).Set(0);
  last_done_ = c.done;
  last_done_at_ = s.uptime_s;
}

}  // namespace dflash

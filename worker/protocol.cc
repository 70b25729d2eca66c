#include "worker/protocol.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dflash {
namespace {

// The flag names, written once: EncodeWorkerArgv writes them, DecodeWorkerArgv
// declares them to CLI11.
constexpr const char* kName = "--name";
constexpr const char* kReady = "--ready";
constexpr const char* kReadyTimeout = "--ready-timeout";
constexpr const char* kReadyStream = "--ready-stream";
constexpr const char* kStopGrace = "--stop-grace";
constexpr const char* kGateDir = "--gate-dir";
constexpr const char* kGateKey = "--gate-key";
constexpr const char* kGateTimeout = "--gate-timeout";
constexpr const char* kGateIdleHint = "--gate-idle-hint";
constexpr const char* kProgress = "--progress";
constexpr const char* kWarmup = "--warmup";
constexpr const char* kPublishUnchanged = "--publish-unchanged";
constexpr const char* kTorchVersion = "--torch-version";
constexpr const char* kGateSources = "--gate-sources";
constexpr const char* kGpuIdentity = "--gpu-identity";
constexpr const char* kLeaderCompileThreads = "--leader-compile-threads";
constexpr const char* kVerbose = "-v,--verbose";

}  // namespace

bool WorkerArgs::operator==(const WorkerArgs& o) const {
  return name == o.name && ready.mode == o.ready.mode && ready.arg == o.ready.arg &&
         ready.timeout == o.ready.timeout && ready.stream == o.ready.stream && stop_grace == o.stop_grace &&
         gate_dir == o.gate_dir && gate_key == o.gate_key && gate_timeout == o.gate_timeout &&
         progress_every == o.progress_every && gate_idle_hint == o.gate_idle_hint && warmup == o.warmup &&
         publish_unchanged == o.publish_unchanged && torch_version == o.torch_version &&
         gate_sources == o.gate_sources && gpu_identity == o.gpu_identity &&
         leader_compile_threads == o.leader_compile_threads && verbose == o.verbose &&
         command == o.command;
}

std::vector<std::string> EncodeWorkerArgv(const std::string& worker_bin, const WorkerArgs& a) {
  const WorkerArgs d;  // the defaults: not written
  std::vector<std::string> v = {worker_bin};
  auto flag = [&](const char* name, const std::string& value) { v.insert(v.end(), {name, value}); };
  if (!a.name.empty()) flag(kName, a.name);
  if (!a.gate_dir.empty()) {
    flag(kGateDir, a.gate_dir);
    flag(kGateKey, a.gate_key);
    flag(kGateTimeout, FormatDuration(a.gate_timeout));
    flag(kGateIdleHint, FormatDuration(a.gate_idle_hint));
  }
  if (a.progress_every != d.progress_every) flag(kProgress, FormatDuration(a.progress_every));
  if (a.warmup) v.push_back(kWarmup);
  if (a.publish_unchanged) v.push_back(kPublishUnchanged);
  if (a.ready.mode != ReadyMode::kNone) {  // "none" is ready at exec: no timeout, no stream
    flag(kReady, FormatReadySpec(a.ready));
    flag(kReadyTimeout, FormatDuration(a.ready.timeout));
    if (a.ready.mode == ReadyMode::kLog && a.ready.stream != d.ready.stream)
      flag(kReadyStream, ReadyStreamName(a.ready.stream));
  }
  if (a.stop_grace != d.stop_grace) flag(kStopGrace, FormatDuration(a.stop_grace));
  if (!a.torch_version.empty()) flag(kTorchVersion, a.torch_version);
  if (!a.gate_dir.empty()) {
    if (!a.gate_sources.empty()) flag(kGateSources, a.gate_sources);
    if (!a.gpu_identity.empty()) flag(kGpuIdentity, a.gpu_identity);
    if (a.leader_compile_threads > 0) flag(kLeaderCompileThreads, std::to_string(a.leader_compile_threads));
  }
  if (a.verbose) v.push_back("--verbose");
  v.push_back("--");
  v.insert(v.end(), a.command.begin(), a.command.end());
  return v;
}

ArgvDecode DecodeWorkerArgv(const std::vector<std::string>& argv, WorkerArgs* out, std::string* err) {
  WorkerArgs a;
  CLI::App app{"Host one command as a supervised payload: the compile gate, readiness, signal forwarding, exit status."};
  app.set_version_flag("--version", DFLASH_VERSION);
  std::string ready = FormatReadySpec(a.ready), ready_timeout = FormatDuration(a.ready.timeout),
              grace = FormatDuration(a.stop_grace), gate_timeout = FormatDuration(a.gate_timeout),
              progress = FormatDuration(a.progress_every), idle_hint = FormatDuration(a.gate_idle_hint),
              stream = ReadyStreamName(a.ready.stream);
  app.add_option(kReady, ready, "readiness: none, exit, notify, file:<path> or log:<regex> (POSIX ERE on whole lines)")
      ->capture_default_str();
  app.add_option(kReadyTimeout, ready_timeout, "how long to wait for readiness (e.g. 20m); 0 = forever")
      ->capture_default_str();
  app.add_option(kStopGrace, grace, "after the stop signal, wait this long before SIGKILL")->capture_default_str();
  app.add_option(kName, a.name, "name of the payload in messages and gate records (default: $DFLASH_PROCESS or the command)");
  app.add_option(kGateDir, a.gate_dir, "take the compile gate of this cache dir for the payload");
  app.add_option(kGateKey, a.gate_key, "the gate key ([A-Za-z0-9._-], at most 128)");
  app.add_option(kGateTimeout, gate_timeout, "longest wait for the gate")->capture_default_str();
  app.add_option(kProgress, progress, "how often to say who holds the gate while waiting")->capture_default_str();
  app.add_option(kReadyStream, stream, "ready = log: match stdout, stderr or both")->capture_default_str();
  app.add_option(kGateIdleHint, idle_hint,
                 "while waiting, say so when the leader used ~no CPU for this long (0 = never)")
      ->capture_default_str();
  app.add_flag(kWarmup, a.warmup,
               "a warm-up: on reuse run nothing; as leader stop the payload once ready (or take its exit 0), "
               "publish READY, exit 0");
  app.add_flag(kPublishUnchanged, a.publish_unchanged,
               "publish READY even if the leader left the gate dir as it was (a payload whose output is not an "
               "Inductor cache in the gate dir)");
  app.add_option(kTorchVersion, a.torch_version, "recorded in READY");
  app.add_option(kGateSources, a.gate_sources,
                 "the derived gate key's files, one \"<sha256 or -> <path>\" per line: into READY, so a later leader "
                 "names the file whose edit changed the key");
  app.add_option(kGpuIdentity, a.gpu_identity, "what a compile is trusted for: into READY and exported archives");
  app.add_option(kLeaderCompileThreads, a.leader_compile_threads,
                 "TORCHINDUCTOR_COMPILE_THREADS for the payload once it leads (0: unchanged)");
  app.add_flag(kVerbose, a.verbose, "say readiness and STATUS= lines on stderr");
  app.footer("Usage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]\n"
             "Exit status: the command's (128+N if signal N killed it); 127/126 cannot execute; 75 gate or "
             "readiness timeout; 73 unusable gate dir; 64 usage.");
  app.prefix_command();  // everything from the first non-option on is the command

  // CLI11 wants the arguments without the program name, last first.
  std::vector<std::string> rest(argv.begin() + (argv.empty() ? 0 : 1), argv.end());
  std::reverse(rest.begin(), rest.end());
  try {
    app.parse(rest);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e);
      return ArgvDecode::kExit;
    }
    *err = e.what();
    return ArgvDecode::kUsage;
  }
  a.command = app.remaining();
  if (!a.command.empty() && a.command[0] != "--" && a.command[0].size() > 1 && a.command[0][0] == '-') {
    // prefix_command() takes an unknown flag as the start of the command: a
    // typo'd worker flag would then be exec'd. No command starts with '-'.
    *err = "unknown option " + a.command[0] + " (the command goes after --; see --help)";
    return ArgvDecode::kUsage;
  }
  if (!a.command.empty() && a.command[0] == "--") a.command.erase(a.command.begin());
  if (a.command.empty()) {
    *err = "no command given\nUsage: dflash-worker [OPTIONS] -- COMMAND [ARGS...]";
    return ArgvDecode::kUsage;
  }
  if (!a.gate_dir.empty() && a.gate_key.empty()) {
    *err = std::string(kGateDir) + " needs " + kGateKey;
    return ArgvDecode::kUsage;
  }
  if (!ParseReadySpec(ready, &a.ready, err) || !ParseDuration(ready_timeout, &a.ready.timeout, err) ||
      !ParseDuration(grace, &a.stop_grace, err) || !ParseDuration(gate_timeout, &a.gate_timeout, err) ||
      !ParseDuration(progress, &a.progress_every, err) || !ParseDuration(idle_hint, &a.gate_idle_hint, err) ||
      !ParseReadyStream(stream, &a.ready.stream, err))
    return ArgvDecode::kUsage;
  if (a.ready.probes()) {  // the payload host has no prober: it would wait until its timeout
    *err = std::string(kReady) + " " + ready + ": tcp/http readiness is probed by dflash-launch's supervisor, "
           "not by dflash-worker; use notify (dflash_launch.notify_ready() once the server listens), log or file";
    return ArgvDecode::kUsage;
  }
  *out = std::move(a);
  return ArgvDecode::kRun;
}

// ------------------------------------------------------------- notify fields

namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// A value on one line: a '\n' would start a forged field.
std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

bool ParseInt(std::string_view s, int* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

bool ParseDouble(std::string_view s, double* out) {
  std::string z(s);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(z.c_str(), &end);
  if (z.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

/// One notify field: its key, how it is written and how it is read back.
/// Adding a field is one row here, one member in NotifyFields and one test.
struct FieldCodec {
  const char* key;
  /// Appends "KEY=value" if `f` carries it.
  void (*encode)(const NotifyFields& f, std::vector<std::string>* lines);
  /// False for a garbled value (the field stays unset).
  bool (*decode)(std::string_view value, NotifyFields* f);
};

#define DFLASH_TEXT_FIELD(KEY, member)                                                                    \
  FieldCodec {                                                                                            \
    KEY, [](const NotifyFields& f, std::vector<std::string>* l) {                                         \
      if (f.member) l->push_back(std::string(KEY) + "=" + OneLine(*f.member));                            \
    },                                                                                                    \
        [](std::string_view v, NotifyFields* f) {                                                         \
          f->member = std::string(v);                                                                     \
          return true;                                                                                    \
        }                                                                                                 \
  }
#define DFLASH_SECONDS_FIELD(KEY, member)                                                                 \
  FieldCodec {                                                                                            \
    KEY, [](const NotifyFields& f, std::vector<std::string>* l) {                                         \
      if (f.member) l->push_back(std::string(KEY) + "=" + Num(*f.member));                                \
    },                                                                                                    \
        [](std::string_view v, NotifyFields* f) {                                                         \
          double d;                                                                                       \
          if (!ParseDouble(v, &d)) return false;                                                          \
          f->member = d;                                                                                  \
          return true;                                                                                    \
        }                                                                                                 \
  }
#define DFLASH_COUNT_FIELD(KEY, member)                                                                   \
  FieldCodec {                                                                                            \
    KEY, [](const NotifyFields& f, std::vector<std::string>* l) {                                         \
      if (f.member) l->push_back(std::string(KEY) + "=" + std::to_string(*f.member));                     \
    },                                                                                                    \
        [](std::string_view v, NotifyFields* f) {                                                         \
          int64_t n = 0;                                                                                  \
          auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);                             \
          if (ec != std::errc() || end != v.data() + v.size() || n < 0) return false;                     \
          f->member = n;                                                                                  \
          return true;                                                                                    \
        }                                                                                                 \
  }
/// A value from an enum's spelling table (contract/gate_facts.h); another spelling is garbled.
#define DFLASH_ENUM_FIELD(KEY, member, names)                                                             \
  FieldCodec {                                                                                            \
    KEY, [](const NotifyFields& f, std::vector<std::string>* l) {                                         \
      if (f.member) l->push_back(std::string(KEY) + "=" + std::string(NameIn(names, *f.member)));         \
    },                                                                                                    \
        [](std::string_view v, NotifyFields* f) {                                                         \
          decltype(f->member)::value_type e{};                                                            \
          if (!ParseIn(names, v, &e)) return false;                                                       \
          f->member = e;                                                                                  \
          return true;                                                                                    \
        }                                                                                                 \
  }
#define DFLASH_FLAG_FIELD(KEY, member)                                                                    \
  FieldCodec {                                                                                            \
    KEY, [](const NotifyFields& f, std::vector<std::string>* l) {                                         \
      if (f.member) l->push_back(std::string(KEY) + "=1");                                                \
    },                                                                                                    \
        [](std::string_view v, NotifyFields* f) {                                                         \
          if (v != "1") return false;                                                                     \
          f->member = true;                                                                               \
          return true;                                                                                    \
        }                                                                                                 \
  }

/// In the order they are written; READY comes last (see EncodeNotify).
const FieldCodec kFields[] = {
    FieldCodec{"MAINPID",
               [](const NotifyFields& f, std::vector<std::string>* l) {
                 if (f.main_pid) l->push_back("MAINPID=" + std::to_string(*f.main_pid));
               },
               [](std::string_view v, NotifyFields* f) {
                 int pid;
                 if (!ParseInt(v, &pid) || pid <= 0) return false;
                 f->main_pid = pid;
                 return true;
               }},
    DFLASH_TEXT_FIELD("STATUS", status),
    DFLASH_FLAG_FIELD("WATCHDOG", watchdog),
    DFLASH_FLAG_FIELD("STOPPING", stopping),
    DFLASH_TEXT_FIELD("X_DFLASH_ERROR", error),
    DFLASH_TEXT_FIELD("X_DFLASH_EXIT", payload_exit),
    FieldCodec{"X_DFLASH_SIGNAL",
               [](const NotifyFields& f, std::vector<std::string>* l) {
                 if (f.payload_signal) l->push_back("X_DFLASH_SIGNAL=" + std::to_string(*f.payload_signal));
               },
               [](std::string_view v, NotifyFields* f) {
                 int sig;
                 if (!ParseInt(v, &sig) || sig <= 0 || sig > 64) return false;
                 f->payload_signal = sig;
                 return true;
               }},
    DFLASH_SECONDS_FIELD("X_DFLASH_READY_S", ready_s),
    DFLASH_TEXT_FIELD("X_DFLASH_GATE_KEY", gate_key),
    DFLASH_ENUM_FIELD("X_DFLASH_GATE_ROLE", gate_role, kGateRoleNames),
    DFLASH_SECONDS_FIELD("X_DFLASH_GATE_WAIT_S", gate_wait_s),
    DFLASH_SECONDS_FIELD("X_DFLASH_GATE_COMPILE_S", gate_compile_s),
    DFLASH_ENUM_FIELD("X_DFLASH_GATE_STATE", gate_state, kGateStateNames),
    DFLASH_TEXT_FIELD("X_DFLASH_GATE_WARNING", gate_warning),
    DFLASH_ENUM_FIELD("X_DFLASH_GATE_CLUSTER", gate_cluster, kClusterOutcomeNames),
    DFLASH_COUNT_FIELD("X_DFLASH_GATE_CLUSTER_TOKEN", gate_cluster_token),
    DFLASH_COUNT_FIELD("X_DFLASH_GATE_FETCH_BYTES", gate_fetch_bytes),
    DFLASH_SECONDS_FIELD("X_DFLASH_GATE_FETCH_S", gate_fetch_s),
    DFLASH_COUNT_FIELD("X_DFLASH_GATE_PUBLISHED_BYTES", gate_published_bytes),
    DFLASH_TEXT_FIELD("X_DFLASH_PRECOMPILE", payload_precompile),
    DFLASH_TEXT_FIELD("X_DFLASH_CACHE_KEY_TAG", payload_cache_key_tag),
    DFLASH_TEXT_FIELD("X_DFLASH_CPU_CAPABILITY", payload_cpu_capability),
    DFLASH_FLAG_FIELD("READY", ready),
};

#undef DFLASH_TEXT_FIELD
#undef DFLASH_SECONDS_FIELD
#undef DFLASH_FLAG_FIELD
#undef DFLASH_ENUM_FIELD
#undef DFLASH_COUNT_FIELD

}  // namespace

bool NotifyFields::operator==(const NotifyFields& o) const {
  return EncodeNotify(*this) == EncodeNotify(o) && ignored == o.ignored;
}

std::string EncodeNotify(const NotifyFields& f) {
  std::vector<std::string> lines;
  for (const FieldCodec& c : kFields) c.encode(f, &lines);
  std::string out;
  for (const std::string& l : lines) {
    if (!out.empty()) out += '\n';
    out += l;
  }
  return out;
}

NotifyFields DecodeNotify(const std::vector<std::pair<std::string, std::string>>& lines) {
  NotifyFields f;
  for (const auto& [k, v] : lines) {
    const FieldCodec* codec = nullptr;
    for (const FieldCodec& c : kFields)
      if (k == c.key) codec = &c;
    if (!codec || !codec->decode(v, &f)) f.ignored.push_back(k + "=" + v);
  }
  return f;
}

NotifyFields DecodeNotify(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> lines;
  std::vector<std::string> malformed;  // no KEY= at all
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      malformed.emplace_back(line);
      continue;
    }
    lines.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  NotifyFields f = DecodeNotify(lines);
  f.ignored.insert(f.ignored.end(), malformed.begin(), malformed.end());
  return f;
}

}  // namespace dflash

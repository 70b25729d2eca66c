// How a payload says "I have finished compiling": the readiness modes of a
// role (`ready = "notify"`, "log:<regex>", "file:<path>", "exit", "none",
// "tcp:<port>", "http:<url>").
#pragma once

#include <regex.h>

#include <memory>
#include <string>
#include <string_view>

#include "common/duration.h"
#include "contract/enum_names.h"
#include "contract/probe_spec.h"

namespace dflash {

enum class ReadyMode {
  kNone,    ///< ready as soon as exec succeeded
  kExit,    ///< ready when the payload exits 0 (warm-up scripts, `seed`)
  kNotify,  ///< READY=1 on NOTIFY_SOCKET (the systemd protocol)
  kFile,    ///< a path appears
  kLog,     ///< a whole line of stdout/stderr matches a regex
  kTcp,     ///< a TCP connect to the process's port succeeds (contract/probe_spec.h)
  kHttp,    ///< GET <url> answers with a status in the set
};

/// The spellings of the modes (run.toml's ready.mode, --ready), written once.
inline constexpr EnumName<ReadyMode> kReadyModeNames[] = {
    {ReadyMode::kNone, "none"}, {ReadyMode::kNotify, "notify"}, {ReadyMode::kLog, "log"},
    {ReadyMode::kFile, "file"}, {ReadyMode::kExit, "exit"},   {ReadyMode::kTcp, "tcp"},
    {ReadyMode::kHttp, "http"},
};
/// "none", "exit", "notify", "file", "log", "tcp", "http".
const char* ReadyModeName(ReadyMode m);

/// A readiness mode, its argument and its timeout.
struct ReadySpec {
  ReadyMode mode = ReadyMode::kNone;
  /// The path for kFile, the POSIX extended regex for kLog; empty otherwise.
  std::string arg;
  /// How long to wait for readiness; zero waits forever.
  Millis timeout{0};
  /// kLog: which output is matched (stdout unless asked: a traceback on
  /// stderr echoes source lines, pattern included).
  enum class Stream { kStdout, kStderr, kBoth } stream = Stream::kStdout;
  /// kTcp, kHttp: what is probed, how often, how long a try may take.
  ProbeSpec probe;
  bool probes() const { return mode == ReadyMode::kTcp || mode == ReadyMode::kHttp; }
  bool Matches(int fd_index) const {  // 0: stdout, 1: stderr
    return stream == Stream::kBoth || (fd_index == 0) == (stream == Stream::kStdout);
  }
};

/// The spellings of ReadySpec::Stream (ready.stream, --ready-stream), written once.
inline constexpr EnumName<ReadySpec::Stream> kReadyStreamNames[] = {
    {ReadySpec::Stream::kStdout, "stdout"}, {ReadySpec::Stream::kStderr, "stderr"}, {ReadySpec::Stream::kBoth, "both"},
};
/// "stdout", "stderr", "both" <-> ReadySpec::Stream.
const char* ReadyStreamName(ReadySpec::Stream s);
bool ParseReadyStream(std::string_view text, ReadySpec::Stream* out, std::string* err);

/// "none", "exit", "notify", "file:<path>", "log:<regex>", "tcp:<port>",
/// "tcp:<ip>:<port>", "http:<http-url>" -> spec (the timeout and the probe's
/// interval, per-try timeout and, for http, statuses ("2xx") are left as they
/// were). False with a reason in `err` otherwise.
bool ParseReadySpec(std::string_view text, ReadySpec* out, std::string* err);

/// The spelling ParseReadySpec reads back: "log:^compiled$".
std::string FormatReadySpec(const ReadySpec& spec);

/// What "not ready" means for a mode, for timeout messages:
/// "notify: no READY=1 received".
std::string DescribeNotReady(const ReadySpec& spec);

/// A POSIX extended regex matched against whole lines. POSIX regexec rather
/// than std::regex: libstdc++'s std::regex recurses per character and can
/// overflow the stack on a single long log line.
class LineMatcher {
 public:
  /// False with regerror's text in `err` if the pattern is invalid.
  bool Compile(const std::string& pattern, std::string* err);
  /// True if the pattern matches anywhere in `line` (which may hold NULs).
  bool Matches(std::string_view line) const;
  bool compiled() const { return re_ != nullptr; }

 private:
  struct Free {
    void operator()(regex_t* r) const;
  };
  std::unique_ptr<regex_t, Free> re_;
};

}  // namespace dflash

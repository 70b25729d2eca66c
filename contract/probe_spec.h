// A network probe of a server process, as run.toml states it: "ready once a TCP
// connect succeeds" (mode tcp) or "ready once GET <url> answers with a status
// in <set>" (mode http); the same probes as liveness evidence. Pure: the URL,
// the status set and the reply's status line are parsed here, with no socket;
// common/net_probe.h does the connect/send/read, the supervisor the timing.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/duration.h"

namespace dflash {

/// HTTP statuses that count as an answer: "2xx", "200", "200,204", "2xx,301".
class StatusSet {
 public:
  /// False with a reason in `err` for anything but comma-separated 3-digit
  /// statuses (100-599) or classes "1xx".."5xx".
  bool Parse(std::string_view text, std::string* err);
  bool Matches(int status) const;
  const std::string& text() const { return text_; }

 private:
  std::vector<std::pair<int, int>> ranges_ = std::vector<std::pair<int, int>>(1, {200, 299});  // inclusive; "2xx"
  std::string text_ = "2xx";
};

enum class ProbeKind { kTcp, kHttp };

struct ProbeSpec {
  ProbeKind kind = ProbeKind::kTcp;
  /// An IP literal (v4 or v6, without brackets): a host name would need DNS,
  /// which can block the loop that supervises every process.
  std::string host = "127.0.0.1";
  /// The port; 0 while `port_name` still has to be resolved.
  int port = 0;
  /// A name of the role's `ports` (port = "http", or url "http://127.0.0.1:{http}/health"):
  /// each process probes its own (ResolveProbe). Empty: `port` is the number given.
  std::string port_name;
  /// kHttp: the request target ("/health?x=1") and the URL as written.
  std::string path = "/";
  std::string url;
  StatusSet statuses;
  /// Between the end of one try and the start of the next, and the most one try may take.
  Millis interval{500};
  Millis timeout{1000};

  /// "tcp 127.0.0.1:8080", "GET http://127.0.0.1:8080/health (2xx)".
  std::string Describe() const;
  /// The bytes sent once connected: empty for kTcp (the connect is the answer).
  std::string Request() const;
};

/// The most bytes read for a status line: a longer first line is no answer.
inline constexpr size_t kMaxStatusLine = 1024;

/// "http://HOST[:PORT][/PATH]" -> host, port (80 if none), path ("/" if none).
/// HOST: an IPv4 literal, [IPv6] or "localhost" (127.0.0.1). Refused, with a
/// hint: https (not spoken), user info, a host name, a bad port, a path with
/// spaces or control bytes (they would forge the request), a fragment.
bool ParseProbeUrl(std::string_view url, ProbeSpec* out, std::string* err);

/// "8080", "127.0.0.1:8080", "[::1]:8080" -> host and port of a kTcp probe.
bool ParseTcpTarget(std::string_view text, ProbeSpec* out, std::string* err);

/// True if `host` is an IP literal (or "localhost", which it rewrites to 127.0.0.1).
bool NormaliseProbeHost(std::string* host, std::string* err);

/// What one http try read (at most kMaxStatusLine bytes; `complete`: a
/// newline or EOF ended it) -> the status, or false with what was wrong
/// ("not an HTTP status line: 'SSH-2.0-Open...'").
bool ParseStatusLine(std::string_view reply, bool complete, int* status, std::string* err);

/// The judgement of one try: true if it counts as an answer; `detail` says
/// what it saw ("HTTP 503", "connection refused", ...) for logs and timeouts.
/// `connected`/`reply`/`complete`/`io_error`: what common/net_probe.h returned.
bool JudgeProbe(const ProbeSpec& spec, bool connected, std::string_view reply, bool complete,
                const std::string& io_error, std::string* detail);

}  // namespace dflash

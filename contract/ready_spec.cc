#include "contract/ready_spec.h"

#include "common/redact.h"

namespace dflash {

bool ParseReadySpec(std::string_view text, ReadySpec* out, std::string* err) {
  std::string_view mode = text.substr(0, text.find(':'));
  std::string_view arg =
      mode.size() < text.size() ? text.substr(mode.size() + 1) : std::string_view();
  bool has_arg = mode.size() < text.size();
  ReadyMode m;
  if (!ParseIn(kReadyModeNames, mode, &m)) {
    if (err) *err = "unknown ready mode '" + std::string(mode) + "' (use none, exit, notify, file:<path>, log:<regex>, tcp:<port> or http:<url>)";
    return false;
  }
  bool needs_arg = m != ReadyMode::kNone && m != ReadyMode::kExit && m != ReadyMode::kNotify;
  if (needs_arg && arg.empty()) {
    if (err) *err = "ready mode '" + std::string(mode) + "' needs an argument: '" + std::string(mode) +
                    (m == ReadyMode::kFile  ? ":<path>'"
                     : m == ReadyMode::kLog ? ":<regex>'"
                     : m == ReadyMode::kTcp ? ":<port>' or ':<ip>:<port>'"
                                            : ":http://<ip>:<port>/<path>'");
    return false;
  }
  if (!needs_arg && has_arg) {
    if (err) *err = "ready mode '" + std::string(mode) + "' takes no argument";
    return false;
  }
  if (m == ReadyMode::kLog) {
    LineMatcher probe;
    std::string rerr;
    if (!probe.Compile(std::string(arg), &rerr)) {
      if (err) *err = "bad regex in 'log:" + std::string(arg) + "': " + rerr;
      return false;
    }
  }
  ProbeSpec probe = out->probe;
  std::string perr;
  if (m == ReadyMode::kTcp && !ParseTcpTarget(arg, &probe, &perr)) {
    if (err) *err = "bad target in 'tcp:" + std::string(arg) + "': " + perr;
    return false;
  }
  if (m == ReadyMode::kHttp && !ParseProbeUrl(arg, &probe, &perr)) {
    if (err) *err = "bad URL in 'http:" + std::string(arg) + "': " + perr;
    return false;
  }
  out->mode = m;
  out->arg = std::string(arg);
  if (out->probes()) out->probe = probe;
  return true;
}

const char* ReadyStreamName(ReadySpec::Stream s) { return NameIn(kReadyStreamNames, s).data(); }

bool ParseReadyStream(std::string_view text, ReadySpec::Stream* out, std::string* err) {
  if (ParseIn(kReadyStreamNames, text, out)) return true;
  *err = "unknown output stream '" + std::string(text) + "': stdout, stderr or both";
  return false;
}

const char* ReadyModeName(ReadyMode m) { return NameIn(kReadyModeNames, m).data(); }

std::string FormatReadySpec(const ReadySpec& spec) {
  bool has_arg = spec.mode != ReadyMode::kNone && spec.mode != ReadyMode::kExit && spec.mode != ReadyMode::kNotify;
  return ReadyModeName(spec.mode) + (has_arg ? ":" + spec.arg : std::string());
}

std::string DescribeNotReady(const ReadySpec& spec) {
  switch (spec.mode) {
    case ReadyMode::kNone: return "none";
    case ReadyMode::kExit: return "exit: still running";
    case ReadyMode::kNotify: return "notify: no READY=1 received";
    case ReadyMode::kFile: return "file: '" + spec.arg + "' does not exist";
    case ReadyMode::kLog: return "log: no output line matched '" + spec.arg + "'";
    case ReadyMode::kTcp: return "tcp: no connect to " + spec.probe.Describe().substr(4) + " succeeded";
    case ReadyMode::kHttp:
      return "http: GET " + RedactSecretsInText(spec.probe.url) + " never answered with " + spec.probe.statuses.text();
  }
  return "?";
}

void LineMatcher::Free::operator()(regex_t* r) const {
  ::regfree(r);
  delete r;
}

bool LineMatcher::Compile(const std::string& pattern, std::string* err) {
  auto re = std::unique_ptr<regex_t, Free>(new regex_t);
  int rc = ::regcomp(re.get(), pattern.c_str(), REG_EXTENDED | REG_NOSUB);
  if (rc != 0) {
    char buf[256];
    ::regerror(rc, re.get(), buf, sizeof buf);
    delete re.release();  // regcomp failed: nothing to regfree
    if (err) *err = buf;
    return false;
  }
  re_ = std::move(re);
  return true;
}

bool LineMatcher::Matches(std::string_view line) const {
  if (!re_) return false;
  // REG_STARTEND (glibc, BSD): match the exact byte range, no NUL needed.
  regmatch_t m[1];
  m[0].rm_so = 0;
  m[0].rm_eo = static_cast<regoff_t>(line.size());
  return ::regexec(re_.get(), line.data(), 1, m, REG_STARTEND) == 0;
}

}  // namespace dflash

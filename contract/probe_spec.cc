#include "contract/probe_spec.h"

#include "common/redact.h"

#include <arpa/inet.h>

#include <cctype>

namespace dflash {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Bytes a server sent, printable and short, for a message.
std::string Shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) out += c;
    else out += "\\x", out += "0123456789abcdef"[u >> 4], out += "0123456789abcdef"[u & 15];
  }
  if (s.size() > 60) out += "...";
  return out;
}

}  // namespace

bool StatusSet::Parse(std::string_view text, std::string* err) {
  std::vector<std::pair<int, int>> ranges;
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view tok = Trim(rest.substr(0, comma));
    if (tok.size() == 3 && tok[0] >= '1' && tok[0] <= '5' && (tok.substr(1) == "xx" || tok.substr(1) == "XX")) {
      int c = (tok[0] - '0') * 100;
      ranges.push_back({c, c + 99});
    } else if (tok.size() == 3 && AllDigits(tok) && tok[0] >= '1' && tok[0] <= '5') {
      int v = std::stoi(std::string(tok));
      ranges.push_back({v, v});
    } else {
      *err = "'" + std::string(tok) + "' is not an HTTP status or class: write e.g. \"2xx\", \"200\" or \"200,204\"";
      return false;
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  ranges_ = std::move(ranges);
  text_ = std::string(text);
  return true;
}

bool StatusSet::Matches(int status) const {
  for (auto [lo, hi] : ranges_)
    if (status >= lo && status <= hi) return true;
  return false;
}

std::string ProbeSpec::Describe() const {
  std::string hp = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  hp += ":" + (port_name.empty() ? std::to_string(port) : port_name);
  if (kind == ProbeKind::kTcp) return "tcp " + hp;
  // As shown (check, reasons, events): a ?token= in a health URL is a secret like any other.
  return "GET " + RedactSecretsInText(url) + " (" + statuses.text() + ")";
}

std::string ProbeSpec::Request() const {
  if (kind == ProbeKind::kTcp) return "";
  std::string hp = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  // HTTP/1.0 and Connection: close: one answer, then the server closes; no
  // keep-alive or chunked body to understand, and only the status line is read.
  return "GET " + path + " HTTP/1.0\r\nHost: " + hp + ":" + std::to_string(port) +
         "\r\nUser-Agent: dflash-launch\r\nConnection: close\r\n\r\n";
}

bool NormaliseProbeHost(std::string* host, std::string* err) {
  if (*host == "localhost") {
    *host = "127.0.0.1";
    return true;
  }
  unsigned char buf[16];
  if (::inet_pton(AF_INET, host->c_str(), buf) == 1 || ::inet_pton(AF_INET6, host->c_str(), buf) == 1) return true;
  *err = "'" + *host +
         "' is not an IP address: a host name would need DNS, which can block the supervisor; write its address "
         "(e.g. 127.0.0.1, or [::1] in a URL)";
  return false;
}

bool ParseProbeUrl(std::string_view url, ProbeSpec* out, std::string* err) {
  if (url.rfind("https://", 0) == 0) {
    *err = "https is not spoken by the readiness probe (only http://): probe a plain-http health port, "
           "or use mode = \"tcp\" on the TLS port";
    return false;
  }
  if (url.rfind("http://", 0) != 0) {
    *err = "not an http:// URL: write e.g. \"http://127.0.0.1:8080/health\"";
    return false;
  }
  for (char c : url) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) {
      *err = "a space or control byte in the URL (it would forge the request): percent-encode it (%20)";
      return false;
    }
  }
  std::string_view rest = url.substr(7);
  size_t slash = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (path.find('#') != std::string::npos) {
    *err = "a #fragment is never sent to a server: remove it";
    return false;
  }
  if (path[0] == '?') path = "/" + path;
  if (authority.find('@') != std::string_view::npos) {
    *err = "user info (user@host) is not supported: the probe sends no credentials";
    return false;
  }
  std::string host;
  std::string_view port_text;
  bool has_port = false;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      *err = "an IPv6 address without its closing ']': write e.g. \"http://[::1]:8080/\"";
      return false;
    }
    host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') {
        *err = "unexpected '" + std::string(after) + "' after the IPv6 address: write [ADDR]:PORT";
        return false;
      }
      has_port = true;
      port_text = after.substr(1);
    }
    unsigned char buf[16];
    if (::inet_pton(AF_INET6, host.c_str(), buf) != 1) {
      *err = "'" + host + "' in brackets is not an IPv6 address";
      return false;
    }
  } else {
    size_t colon = authority.find(':');
    host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      has_port = true;
      port_text = authority.substr(colon + 1);
    }
    if (host.empty()) {
      *err = "no host in the URL: write e.g. \"http://127.0.0.1:8080/health\"";
      return false;
    }
    if (!NormaliseProbeHost(&host, err)) return false;
  }
  int port = 80;
  if (has_port) {
    if (!AllDigits(port_text) || port_text.size() > 5 || std::stoi(std::string(port_text)) < 1 ||
        std::stoi(std::string(port_text)) > 65535) {
      *err = "port '" + std::string(port_text) + "' is not a number from 1 to 65535";
      return false;
    }
    port = std::stoi(std::string(port_text));
  }
  out->kind = ProbeKind::kHttp;
  out->host = host;
  out->port = port;
  out->path = path;
  out->url = std::string(url);
  return true;
}

bool ParseTcpTarget(std::string_view text, ProbeSpec* out, std::string* err) {
  std::string host = out->host;
  std::string_view port_text = text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find("]:");
    if (close == std::string_view::npos) {
      *err = "write an IPv6 target as [ADDR]:PORT, e.g. [::1]:8080";
      return false;
    }
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else if (size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (!NormaliseProbeHost(&host, err)) return false;
  if (!AllDigits(port_text) || port_text.size() > 5 || std::stoi(std::string(port_text)) < 1 ||
      std::stoi(std::string(port_text)) > 65535) {
    *err = "port '" + std::string(port_text) + "' is not a number from 1 to 65535";
    return false;
  }
  out->kind = ProbeKind::kTcp;
  out->host = host;
  out->port = std::stoi(std::string(port_text));
  return true;
}

bool ParseStatusLine(std::string_view reply, bool complete, int* status, std::string* err) {
  size_t nl = reply.find('\n');
  if (nl == std::string_view::npos && !complete) {
    *err = reply.size() >= kMaxStatusLine
               ? "no status line within " + std::to_string(kMaxStatusLine) + " bytes: '" + Shown(reply) + "'"
               : "the answer ended inside its status line: '" + Shown(reply) + "'";
    return false;
  }
  std::string_view line = reply.substr(0, nl);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty()) {
    *err = reply.empty() ? "the server closed the connection without answering" : "an empty status line";
    return false;
  }
  // HTTP/<d>.<d> SP <3 digits> [SP reason]
  bool ok = line.size() >= 12 && line.substr(0, 5) == "HTTP/" && std::isdigit(static_cast<unsigned char>(line[5])) &&
            line[6] == '.' && std::isdigit(static_cast<unsigned char>(line[7])) && line[8] == ' ' &&
            AllDigits(line.substr(9, 3)) && (line.size() == 12 || line[12] == ' ');
  if (!ok) {
    *err = "not an HTTP status line: '" + Shown(line) + "'";
    return false;
  }
  *status = std::stoi(std::string(line.substr(9, 3)));
  return true;
}

bool JudgeProbe(const ProbeSpec& spec, bool connected, std::string_view reply, bool complete,
                const std::string& io_error, std::string* detail) {
  if (!io_error.empty()) {
    *detail = io_error;
    return false;
  }
  if (!connected) {
    *detail = "not connected";
    return false;
  }
  if (spec.kind == ProbeKind::kTcp) {
    *detail = "connected";
    return true;
  }
  int status = 0;
  if (!ParseStatusLine(reply, complete, &status, detail)) return false;
  *detail = "HTTP " + std::to_string(status);
  if (spec.statuses.Matches(status)) return true;
  *detail += " (wanted " + spec.statuses.text() + ")";
  return false;
}

}  // namespace dflash

// A [[role]]'s ready and liveness: how a process says it is ready (notify, a log line, a file,
// its exit, or a tcp/http probe) and the probe that tells it still lives.
#include <algorithm>

#include "launcher/config/config_internal.h"

namespace dflash {

namespace {

/// "http://127.0.0.1:{http}/health" -> the URL with a placeholder port (for
/// ParseProbeUrl) and `name` = "http"; any other URL as it is, `name` cleared.
std::string NamePortInUrl(const std::string& url, std::string* name) {
  name->clear();
  size_t open = url.find(":{"), close = open == std::string::npos ? open : url.find('}', open);
  if (close == std::string::npos) return url;
  *name = url.substr(open + 2, close - open - 2);
  return url.substr(0, open) + ":1" + url.substr(close + 1);
}

/// The keys of a tcp/http probe (role.ready and role.liveness): port and host,
/// or url and status; interval and probe_timeout. `kind`: "tcp", "http", or
/// anything else when the mode is not a probe (then each key given is an error).
/// `what`: "ready" or "liveness", for the examples.
void ReadProbeKeys(TableReader& r, const toml::node* n, const std::string& kind, const std::string& what,
                   ProbeSpec* p) {
  bool tcp = kind == "tcp", http = kind == "http";
  SourcePos where = n ? PosOf(n->source()) : r.TablePos();
  auto only = [&](const char* key, bool applies, const char* to, const char* hint) {
    if (r.Has(key) && !applies)
      r.Error(key, r.ValuePos(key), std::string(key) + " only applies to " + to, to, "mode = \"" + kind + "\"",
              hint);
  };
  only("port", tcp, "mode = \"tcp\"", http ? "the port goes in the url: \"http://127.0.0.1:8080/health\"" : "set mode = \"tcp\" or remove port");
  only("host", tcp, "mode = \"tcp\"", http ? "the address goes in the url" : "set mode = \"tcp\" or remove host");
  only("url", http, "mode = \"http\"", "set mode = \"http\" or remove url");
  only("status", http, "mode = \"http\"", "set mode = \"http\" or remove status");
  only("interval", tcp || http, "mode = \"tcp\" or \"http\"", "remove interval: only a network probe is polled");
  only("probe_timeout", tcp || http, "mode = \"tcp\" or \"http\"", "remove probe_timeout: only a network probe has one");
  if (!tcp && !http) return;
  r.Duration("interval", &p->interval);
  r.Duration("probe_timeout", &p->timeout);
  if (tcp) {
    p->kind = ProbeKind::kTcp;
    const toml::node* port = r.Get("port");
    if (!port) {
      r.Error("port", where, "mode = \"tcp\" needs a port", "a port number from 1 to 65535", "no port",
              "e.g. " + what + " = { mode = \"tcp\", port = 8080 }");
    } else if (port->is_string()) {
      // A name of the role's `ports`: each process probes its own (checked once `ports` is read).
      p->port_name = port->as_string()->get();
    } else {
      r.Int("port", &p->port, 1, 65535);
    }
    r.String("host", &p->host);
    std::string err;
    if (!NormaliseProbeHost(&p->host, &err))
      r.Error("host", r.ValuePos("host"), "not an IP address", "an IPv4 or IPv6 literal, or \"localhost\"",
              "\"" + p->host + "\"", err);
    return;
  }
  std::string url, status, err;
  r.String("url", &url);
  if (!r.Has("url") || url.empty()) {
    r.Error("url", r.Has("url") ? r.ValuePos("url") : where, "mode = \"http\" needs a url",
            "\"http://ADDR[:PORT][/PATH]\"", r.Has("url") ? "\"\"" : "no url",
            "e.g. " + what + " = { mode = \"http\", url = \"http://127.0.0.1:8080/health\" }");
  } else if (!ParseProbeUrl(NamePortInUrl(url, &p->port_name), p, &err)) {
    r.Error("url", r.ValuePos("url"), url.rfind("https://", 0) == 0 ? "https is not supported" : "not a probe URL",
            "\"http://ADDR[:PORT][/PATH]\" (ADDR an IP literal, [v6] or localhost)", "\"" + url + "\"", err);
  }
  p->kind = ProbeKind::kHttp;
  if (!p->port_name.empty()) {
    p->port = 0;  // resolved per process
    p->url = url;
  }
  if (r.String("status", &status) && !p->statuses.Parse(status, &err))
    r.Error("status", r.ValuePos("status"), "not a status set", "classes and codes like \"2xx\" or \"200,204\"",
            "\"" + status + "\"", err);
}

}  // namespace

/// A probe's named port must be one of the role's `ports`.
void CheckProbePortName(TableReader& r, const char* key, const ProbeSpec& p, const RoleSpec& role) {
  if (p.port_name.empty() || std::find(role.ports.begin(), role.ports.end(), p.port_name) != role.ports.end()) return;
  r.Error(key, r.ValuePos(key), "no port named \"" + p.port_name + "\" in this role's ports",
          role.ports.empty() ? "a port number, or a name listed in ports" : "one of: " + [&] {
            std::string all;
            for (const std::string& n : role.ports) all += (all.empty() ? "" : ", ") + n;
            return all;
          }(),
          "\"" + p.port_name + "\"", "add ports = [\"" + p.port_name + "\"] to the role, or write the port number");
}

void ReadReady(const toml::node* n, const std::string& prefix, ReadySpec* rs, std::vector<ConfigError>* errors,
               TableReader& role, bool* given) {
  static const toml::table empty;
  *given = n != nullptr;
  const toml::table* t = &empty;
  if (n && n->is_table()) {
    t = n->as_table();
  } else if (n && !n->is_string()) {
    role.TypeError("ready", *n);
    return;
  }
  TableReader r(*t, "role.ready", prefix + ".ready", errors);
  std::string mode;
  bool mode_ok = true;
  if (n && n->is_string()) {
    // `ready = "notify"` is short for `ready = { mode = "notify" }`.
    mode = n->as_string()->get();
    const KeySpec& k = *FindKey("role.ready", "mode");
    if (std::find(k.choices.begin(), k.choices.end(), mode) == k.choices.end()) {
      std::string close = ClosestName(mode, k.choices);
      role.Error("ready", PosOf(n->source()), "unknown readiness mode", DescribeType(k), "\"" + mode + "\"",
                 close.empty() ? "e.g. ready = \"notify\"" : "did you mean \"" + close + "\"?");
      mode_ok = false;
    }
  } else {
    mode_ok = r.Enum("mode", &mode);
  }
  rs->mode = ReadyMode::kNone;
  ParseIn(kReadyModeNames, mode, &rs->mode);  // an unknown mode was reported: kNone stands in
  std::string pattern, path;
  r.String("pattern", &pattern);
  r.String("path", &path);
  std::string stream;
  if (r.Enum("stream", &stream)) {
    std::string ignored;
    ParseReadyStream(stream, &rs->stream, &ignored);
  }
  if (r.Has("stream") && rs->mode != ReadyMode::kLog && mode_ok)
    r.Error("stream", r.ValuePos("stream"), "stream only applies to mode = \"log\"", "mode = \"log\"",
            "mode = \"" + mode + "\"", "set mode = \"log\" or remove stream");
  rs->arg = rs->mode == ReadyMode::kLog ? pattern : rs->mode == ReadyMode::kFile ? path : "";
  r.Duration("timeout", &rs->timeout);
  if (!mode_ok) return;
  if (rs->mode == ReadyMode::kLog) {
    if (!r.Has("pattern")) {
      r.Error("pattern", n ? PosOf(n->source()) : r.TablePos(), "mode = \"log\" needs a pattern",
              "a POSIX extended regex", "no pattern", "e.g. ready = { mode = \"log\", pattern = \"compiled\" }");
    } else if (std::string err; !LineMatcher().Compile(pattern, &err)) {
      r.Error("pattern", r.ValuePos("pattern"), "not a valid regular expression: " + err,
              "a POSIX extended regex", "\"" + pattern + "\"", "escape special characters like ( [ { with \\\\");
    }
  } else if (r.Has("pattern")) {
    r.Error("pattern", r.ValuePos("pattern"), "pattern only applies to mode = \"log\"", "mode = \"log\"",
            "mode = \"" + mode + "\"", "set mode = \"log\" or remove pattern");
  }
  ReadProbeKeys(r, n, mode, "ready", &rs->probe);
  if (rs->mode == ReadyMode::kTcp) rs->arg = rs->probe.Describe().substr(4);  // "127.0.0.1:8080": `tcp:` + it reads back
  if (rs->mode == ReadyMode::kHttp) rs->arg = rs->probe.url;
  if (rs->mode == ReadyMode::kFile) {
    if (!r.Has("path") || path.empty())
      r.Error("path", n ? PosOf(n->source()) : r.TablePos(), "mode = \"file\" needs a path", "a path string",
              "no path", "e.g. ready = { mode = \"file\", path = \"/tmp/compiled\" }");
  } else if (r.Has("path")) {
    r.Error("path", r.ValuePos("path"), "path only applies to mode = \"file\"", "mode = \"file\"",
            "mode = \"" + mode + "\"", "set mode = \"file\" or remove path");
  }
  r.RejectUnknownKeys();
}

void ReadLiveness(const toml::node* n, const std::string& prefix, LivenessSpec* l, std::vector<ConfigError>* errors,
                  TableReader& role) {
  if (!n) return;
  if (!n->is_table()) {
    role.TypeError("liveness", *n);
    return;
  }
  TableReader r(*n->as_table(), "role.liveness", prefix + ".liveness", errors);
  std::string mode;
  if (!r.Has("mode")) {
    r.Error("mode", r.TablePos(), "liveness needs a mode", "\"tcp\" or \"http\"", "no mode",
            "e.g. liveness = { mode = \"http\", url = \"http://127.0.0.1:8080/health\" }");
  } else if (r.Enum("mode", &mode)) {
    l->enabled = true;
    ReadProbeKeys(r, n, mode, "liveness", &l->probe);
  }
  r.Int("failures", &l->failures, 1, 1000);
  r.RejectUnknownKeys();
}

}  // namespace dflash

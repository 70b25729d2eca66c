// run.toml -> RunConfig: the table walk and per-key types. Cross-field rules
// (GPU conflicts, the shape contract, restart budgets, the cache dir) are in config_validate.cc.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "common/duration.h"
#include "common/fd.h"
#include "common/redact.h"
#include "common/signal_names.h"
#include "launcher/config/config.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/env_refs.h"
#include "launcher/config/toml_guard.h"
#include "launcher/config/toml_reader.h"
#include "store/redis_client.h"

namespace dflash {
namespace fs = std::filesystem;

namespace {

constexpr long long kIntMax = 2147483647;

bool ValidName(std::string_view s, bool allow_upper_dot) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              (allow_upper_dot && ((c >= 'A' && c <= 'Z') || c == '.'));
    if (!ok) return false;
  }
  return allow_upper_dot || (s[0] >= 'a' && s[0] <= 'z');
}

/// Relative paths are relative to the config file; "~/" is $HOME.
std::string ResolvePath(const std::string& p, const std::string& base_dir) {
  if (p.rfind("~/", 0) == 0 || p == "~") {
    const char* home = std::getenv("HOME");
    return (fs::path(home ? home : "/") / p.substr(std::min<size_t>(2, p.size()))).lexically_normal().string();
  }
  fs::path path(p);
  if (path.is_relative()) path = fs::path(base_dir) / path;
  std::string out = path.lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();  // "dir/." normalises to "dir/"
  return out;
}

/// master_port: "auto" (0) or a port. Both spellings in one key, so no schema default can be a wrong type.
void ReadMasterPort(TableReader& r, RunSpec* run) {
  const toml::node* n = r.Get("master_port");
  run->master_port = 0;
  run->master_port_pos = r.ValuePos("master_port");
  if (!n) return;
  if (n->is_string()) {
    const std::string& text = n->as_string()->get();
    bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    if (digits)
      r.Error("master_port", r.ValuePos("master_port"), "wrong type", DescribeType(*FindKey("run", "master_port")),
              DescribeNode(*n), "remove the quotes: master_port = " + text);
    else if (text != "auto")
      r.Error("master_port", r.ValuePos("master_port"), "not a port", DescribeType(*FindKey("run", "master_port")),
              DescribeNode(*n), "write master_port = \"auto\" (a free port per run) or a number like 29500");
    return;
  }
  if (!n->is_integer()) {
    r.TypeError("master_port", *n);
    return;
  }
  int64_t v = n->as_integer()->get();
  if (v < 1 || v > 65535) {
    r.Error("master_port", r.ValuePos("master_port"), "out of range", "a port from 1 to 65535", std::to_string(v),
            "e.g. master_port = 29500, or \"auto\"");
    return;
  }
  run->master_port = static_cast<int>(v);
}

/// store: "private" or a redis:// URL (store/redis_client.h parses it); the store_* timings.
void ReadStore(TableReader& r, const std::string& base_dir, RunSpec* run) {
  run->store_pos = r.ValuePos("store");
  r.String("store", &run->store);
  if (!r.Has("store")) run->store.clear();  // the schema's "<none>" is for people, not a value
  if (r.Has("store") && run->store != "private") {
    StoreUrl url;
    std::string err;
    // What precedes an '@' may be a password: never echoed (ParseStoreUrl's message hides it too).
    std::string shown = run->store;
    if (auto at = shown.rfind('@'); at != std::string::npos) shown = "redis://***" + shown.substr(at);
    if (!ParseStoreUrl(run->store, &url, &err))
      r.Error("store", run->store_pos, "not a store", "\"private\" or \"redis://HOST[:PORT][/DB]\"",
              "\"" + shown + "\"",
              err + "; e.g. store = \"redis://10.0.0.5:6379\", or store = \"private\" (node 0 starts one)");
  }
  r.Duration("store_ttl", &run->store_ttl);
  r.Duration("store_barrier_timeout", &run->store_barrier_timeout);
  r.Duration("store_outage", &run->store_outage);
  if (run->store_ttl.count() > 0 && run->store_ttl < Millis(300))
    r.Error("store_ttl", r.ValuePos("store_ttl"), "too short", "at least 300ms",
            FormatDuration(run->store_ttl), "a node refreshes its registration every ttl/3; e.g. store_ttl = \"5s\"");
  // The password itself is never in the config: a file or a variable names where it is.
  std::string file;
  r.String("store_password_file", &file);
  r.String("store_password_env", &run->store_password_env);
  r.String("store_user", &run->store_user);
  // The schema's "<none>" is for people, not a value.
  if (!r.Has("store_password_env")) run->store_password_env.clear();
  if (!r.Has("store_user")) run->store_user.clear();
  if (r.Has("store_password_file")) {
    if (file.empty())
      r.Error("store_password_file", r.ValuePos("store_password_file"), "empty path", "a file path", "\"\"",
              "e.g. store_password_file = \"~/.config/dflash/store.secret\" (chmod 600)");
    else
      run->store_password_file = ResolvePath(file, base_dir);
  }
  if (r.Has("store_password_file") && r.Has("store_password_env"))
    r.Error("store_password_env", r.ValuePos("store_password_env"), "conflicts with store_password_file",
            "one of store_password_file or store_password_env", "both", "remove one of the two");
  if (r.Has("store_password_env") && !ValidEnvName(run->store_password_env))
    r.Error("store_password_env", r.ValuePos("store_password_env"), "not an environment variable name",
            "letters, digits and '_', not starting with a digit", "\"" + run->store_password_env + "\"",
            "name the variable, not its value: e.g. store_password_env = \"DFLASH_STORE_PASSWORD\"");
  if (r.Has("store_user") && !run->store_user.empty() &&
      run->store_user.find_first_of(" \t\r\n") != std::string::npos)
    r.Error("store_user", r.ValuePos("store_user"), "not a Redis ACL user name", "a name without spaces",
            "\"" + run->store_user + "\"", "e.g. store_user = \"dflash\"");
}

void ReadRun(const toml::table* t, const std::string& file, const std::string& base_dir, RunSpec* run,
             std::vector<ConfigError>* errors) {
  static const toml::table empty;
  TableReader r(t ? *t : empty, "run", "run", errors);
  std::string stem = fs::path(file).stem().string();
  r.String("name", &run->name);
  if (!r.Has("name")) run->name = stem;
  if (!ValidName(run->name, true))
    r.Error("name", r.ValuePos("name"), "not a valid run name", "letters, digits, '.', '_' or '-' (at most 128)",
            "\"" + run->name + "\"", r.Has("name") ? "e.g. name = \"qwen36-27b-dflash\""
                                                   : "set [run] name = \"...\" (the file name is used by default)");
  std::string cache, log, spool;
  r.String("cache_dir", &cache);
  r.String("log_dir", &log);
  r.String("spool_dir", &spool);
  if (!r.Has("cache_dir")) cache = "~/.cache/dflash/" + run->name;
  if (!r.Has("spool_dir")) spool = "/dev/shm/dflash-" + std::to_string(::getuid()) + "-" + run->name;
  for (auto [key, value] : {std::pair{"cache_dir", &cache}, {"log_dir", &log}, {"spool_dir", &spool}}) {
    if (r.Has(key) && value->empty())
      r.Error(key, r.ValuePos(key), "empty path", "a directory path", "\"\"",
              "remove the key to take the default (" + std::string(FindKey("run", key)->default_value) + ")");
  }
  run->cache_dir = ResolvePath(cache, base_dir);
  run->log_dir = ResolvePath(log, base_dir);
  run->spool_dir = ResolvePath(spool, base_dir);
  run->spool_dir_given = r.Has("spool_dir");
  if (r.Has("log_group")) r.String("log_group", &run->log_group); else r.Get("log_group");
  r.String("master_addr", &run->master_addr);
  run->master_addr_given = r.Has("master_addr");
  ReadMasterPort(r, run);
  if (r.Has("nnodes")) r.Int("nnodes", &run->nnodes, 1, 65536); else r.Get("nnodes");
  r.SignalArray("forward_signals", &run->forward_signals);
  r.Bool("share_gpus", &run->share_gpus);
  ReadStore(r, base_dir, run);
  if (const toml::node* n = t ? t->get("forward_signals") : nullptr; n && n->is_array()) {
    for (const toml::node& e : *n->as_array()) {
      int sig = e.is_string() ? SignalFromName(e.as_string()->get()) : 0;
      if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
        r.Error("forward_signals", PosOf(e.source()), "this signal cannot be forwarded",
                "a catchable signal such as \"SIGUSR1\" or \"SIGUSR2\"", DescribeNode(e),
                "SIGKILL and SIGSTOP cannot be caught and SIGCHLD is the supervisor's own");
    }
  }
  r.RejectUnknownKeys();
}

void ReadModel(const toml::table& t, ModelSpec* m, std::vector<ConfigError>* errors) {
  TableReader r(t, "model", "model", errors);
  m->present = true;
  for (const char* k : {"target_layers", "hidden", "seq_len"}) {
    if (!r.Has(k))
      r.Error(k, r.TablePos(), "missing required key", DescribeType(*FindKey("model", k)), "nothing",
              "add " + std::string(k) + " = " + std::string(FindKey("model", k)->example) + " to [model]");
  }
  r.Int("target_layers", &m->target_layers, 1, 100000);
  r.Int("hidden", &m->hidden, 1, kIntMax);
  r.Int("draft_layers", &m->draft_layers, 1, 1000);
  r.Int("block_size", &m->block_size, 2, 4096);
  r.Int("seq_len", &m->seq_len, 1, kIntMax);
  r.Int("batch", &m->batch, 1, kIntMax);
  r.Enum("dtype", &m->dtype);
  if (r.Has("heads")) r.Int("heads", &m->heads, 1, 100000); else r.Get("heads");
  if (r.Has("kv_heads")) r.Int("kv_heads", &m->kv_heads, 1, 100000); else r.Get("kv_heads");
  r.Int("vocab", &m->vocab, 2, kIntMax);
  r.Int64("seed", &m->seed);
  std::vector<SourcePos> tap_pos;
  if (r.Has("tapped_layers")) {
    r.IntArray("tapped_layers", &m->tapped_layers, 0, kIntMax, &tap_pos);
  } else {
    r.Get("tapped_layers");
    m->tapped_layers_derived = true;
  }
  // The shape contract keys are checked against the derived shape in config_validate.cc.
  r.Get("input_shape");
  r.Get("input_layout");
  r.Get("fc_in");
  if (r.Has("input_layout")) {
    std::string layout;
    r.Enum("input_layout", &layout);
  }
  if (const toml::node* n = t.get("fc_in"); n && !n->is_integer()) r.TypeError("fc_in", *n);
  if (const toml::node* n = t.get("input_shape"); n && !n->is_array()) r.TypeError("input_shape", *n);
  r.RejectUnknownKeys();
}

// ---- [[role]] and its sub-tables ----

void ReadGate(const toml::node* n, const std::string& prefix, GateSpec* g, std::vector<ConfigError>* errors,
              TableReader& role) {
  static const toml::table empty;
  if (!n) return;
  if (n->is_boolean()) {
    g->enabled = n->as_boolean()->get();
    TableReader r(empty, "role.gate", prefix + ".gate", errors);
    r.Duration("timeout", &g->timeout);
    r.Duration("idle_hint", &g->idle_hint, true);
    return;
  }
  if (!n->is_table()) {
    role.TypeError("gate", *n);
    return;
  }
  TableReader r(*n->as_table(), "role.gate", prefix + ".gate", errors);
  r.Bool("enabled", &g->enabled);
  r.String("key", &g->key);
  if (r.Has("key") && !ValidName(g->key, true))
    r.Error("key", r.ValuePos("key"), "not a valid gate key", "letters, digits, '.', '_' or '-' (1 to 128)",
            "\"" + g->key + "\"", "e.g. key = \"drafter\"; or remove it to derive one from the role and [model]");
  if (!r.Has("key")) g->key.clear();
  std::string mode;
  if (r.Enum("mode", &mode)) ParseIn(kGateModeNames, mode, &g->mode);
  std::string hold;
  if (r.Enum("hold", &hold)) ParseIn(kGateHoldNames, hold, &g->hold);
  r.StringArray("key_files", &g->key_files);
  if (r.Has("key_files") && r.Has("key"))
    r.Error("key_files", r.ValuePos("key_files"), "key_files only go into a derived key", "no explicit key",
            "key = \"" + g->key + "\"", "remove key to derive one (it then covers these files), or remove key_files");
  for (const std::string& f : g->key_files)
    if (f.empty())
      r.Error("key_files", r.ValuePos("key_files"), "an empty pattern", "glob(7) patterns", "\"\"",
              "e.g. key_files = [\"model/*.py\"]");
  r.Duration("timeout", &g->timeout);
  r.Duration("idle_hint", &g->idle_hint, true);
  if (bool on = false; r.Has("precompile") && r.Bool("precompile", &on)) {
    g->precompile = on;
    g->precompile_pos = r.ValuePos("precompile");
  }
  if (const toml::node* ready = n->as_table()->get("ready")) {
    // The architecture sketch put ready inside gate; it is a role key of its own.
    errors->push_back({PosOf(n->as_table()->find("ready")->first.source()), prefix + ".gate.ready",
                       "readiness is set on the role, not inside gate", "role.ready",
                       DescribeNode(*ready), "move it out: ready = " +
                           std::string(ready->is_string() ? "\"" + std::string(ready->as_string()->get()) + "\""
                                                          : std::string("{ ... }")) + " on the [[role]]"});
    r.Ignore("ready");  // reported once, not again as an unknown key
  }
  r.RejectUnknownKeys();
}

/// "http://127.0.0.1:{http}/health" -> the URL with a placeholder port (for
/// ParseProbeUrl) and `name` = "http"; any other URL as it is, `name` cleared.
std::string NamePortInUrl(const std::string& url, std::string* name) {
  name->clear();
  size_t open = url.find(":{"), close = open == std::string::npos ? open : url.find('}', open);
  if (close == std::string::npos) return url;
  *name = url.substr(open + 2, close - open - 2);
  return url.substr(0, open) + ":1" + url.substr(close + 1);
}

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

void ReadBackoff(TableReader& r, RestartSpec* rs) {
  const toml::node* n = r.Get("backoff");
  std::string text(n ? "" : FindKey("role.restart", "backoff")->default_value);
  if (n) {
    if (!n->is_string()) {
      r.TypeError("backoff", *n);
      return;
    }
    text = n->as_string()->get();
  }
  size_t dots = text.find("..");
  std::string err;
  if (dots == std::string::npos) {
    r.Error("backoff", r.ValuePos("backoff"), "backoff needs a range", "\"MIN..MAX\" like \"5s..2m\"",
            "\"" + text + "\"", "e.g. backoff = \"" + text + ".." + text + "\" for a fixed delay");
    return;
  }
  std::string lo = text.substr(0, dots), hi = text.substr(dots + 2);
  if (!ParseDuration(lo, &rs->backoff_min, &err) || !ParseDuration(hi, &rs->backoff_max, &err)) {
    r.Error("backoff", r.ValuePos("backoff"), "bad duration in backoff: " + err, "\"MIN..MAX\" like \"5s..2m\"",
            "\"" + text + "\"", "each side is a duration with a unit, e.g. \"5s..2m\"");
    return;
  }
  if (rs->backoff_min > rs->backoff_max)
    r.Error("backoff", r.ValuePos("backoff"), "backoff MIN is larger than MAX", "MIN <= MAX",
            "\"" + text + "\"", "swap them: \"" + hi + ".." + lo + "\"");
}

void ReadRestart(const toml::node* n, const std::string& prefix, RestartSpec* rs, std::vector<ConfigError>* errors,
                 TableReader& role) {
  static const toml::table empty;
  const toml::table* t = &empty;
  if (n && !n->is_table()) {
    role.TypeError("restart", *n);
    return;
  }
  if (n) t = n->as_table();
  TableReader r(*t, "role.restart", prefix + ".restart", errors);
  std::string policy, scope;
  r.Enum("policy", &policy);
  r.Enum("scope", &scope);
  rs->policy = RestartPolicy::kNever;  // an unknown value was reported: the defaults stand in
  rs->scope = RestartScope::kProcess;
  ParseIn(kRestartPolicyNames, policy, &rs->policy);
  ParseIn(kRestartScopeNames, scope, &rs->scope);
  r.Int("max", &rs->max, -kIntMax, 1'000'000);
  r.Duration("window", &rs->window);
  ReadBackoff(r, rs);
  r.Duration("reset_after", &rs->reset_after);
  r.IntArray("no_restart_exit_codes", &rs->no_restart_exit_codes, 0, 255);
  CheckRestartBudget(r, policy, *rs);
  r.RejectUnknownKeys();
}

void ReadStop(const toml::node* n, const std::string& prefix, StopSpec* s, std::vector<ConfigError>* errors,
              TableReader& role) {
  static const toml::table empty;
  const toml::table* t = &empty;
  if (n && !n->is_table()) {
    role.TypeError("stop", *n);
    return;
  }
  if (n) t = n->as_table();
  TableReader r(*t, "role.stop", prefix + ".stop", errors);
  r.Signal("signal", &s->signal);
  r.Duration("grace", &s->grace, /*allow_zero=*/true);
  r.RejectUnknownKeys();
}

/// `${NAME}` in each argument of `argv` (read from `node`, an array of strings) from dflash-launch's own
/// environment (env_refs.h); what cannot be expanded is an error at that argument.
void ExpandRefs(TableReader& r, const toml::node* node, const char* key, std::vector<std::string>* argv) {
  if (!node || !node->is_array()) return;
  const toml::array& a = *node->as_array();
  for (size_t i = 0; i < argv->size() && i < a.size(); ++i) {
    std::string out, name, why;
    if (ExpandEnvRefs((*argv)[i], [](const std::string& n) { return std::getenv(n.c_str()); }, &out, &name, &why)) {
      (*argv)[i] = std::move(out);
      continue;
    }
    bool var = why == "unset" || why == "empty";
    r.Error(std::string(key) + "[" + std::to_string(i) + "]", PosOf(a[i].source()),
            var ? "${" + name + "} is " + why + " in dflash-launch's environment" : "a ${...} that is " + why,
            var ? name + " set to a value: ${NAME} in a command is the launcher's environment variable NAME"
                : "${NAME}, NAME of letters, digits and '_', closed by }",
            var ? name + " " + why : "\"" + (*argv)[i] + "\"",
            var ? "export " + name + "=... before dflash-launch (docs/config.md, \"Values from the launcher's "
                  "environment\")"
                : "write $${ for a literal ${");
  }
}

void ReadEnv(TableReader& r, RoleSpec* role) {
  const toml::node* n = r.Get("env");
  if (!n) return;
  if (!n->is_table()) {
    r.TypeError("env", *n);
    return;
  }
  for (auto&& [k, v] : *n->as_table()) {
    std::string name(k.str());
    if (!ValidEnvName(name)) {
      r.Error("env", PosOf(k.source()), "not a valid environment variable name", "[A-Za-z_][A-Za-z0-9_]*",
              "`" + name + "`", "use letters, digits and '_', not starting with a digit");
      continue;
    }
    if (IsReservedEnv(name)) {
      r.Error("env", PosOf(k.source()), name + " is set by dflash-launch for each process",
              "a variable dflash-launch does not manage", "`" + name + "`", ReservedEnvHint(name));
      continue;
    }
    // A secret's value is not echoed, not even a mistyped one (common/redact.h).
    const bool secret = IsSecretEnvName(name);
    if (!v.is_string()) {
      r.Error("env", PosOf(v.source()), "environment values are strings", "a string",
              secret ? std::string(v.is_integer() ? "an integer" : "not a string") : DescribeNode(v),
              v.is_integer() && !secret ? "quote it: " + name + " = \"" + std::to_string(v.as_integer()->get()) + "\""
                                        : "quote it: " + name + " = \"...\"");
      continue;
    }
    std::string value(v.as_string()->get());
    if (size_t nul = value.find('\0'); nul != std::string::npos) {
      // execve takes C strings: the value would be cut at the NUL, silently.
      r.Error("env", PosOf(v.source()), "environment values cannot hold a NUL character (\\u0000)",
              "a string without NUL", "a NUL at offset " + std::to_string(nul) + " of " + name + "'s value",
              secret ? std::string("remove the \\u0000: the process would see only its first ") +
                           std::to_string(nul) + " bytes"
                     : "remove the \\u0000: the process would see only \"" +
                           RedactUrlCredentials(value.substr(0, nul)) + "\"");
      continue;
    }
    role->env.emplace_back(name, std::move(value));
    role->env_pos.push_back(PosOf(v.source()));
  }
}

/// ports = ["http", "metrics"]: names [a-z][a-z0-9_]*, each once. Two roles whose
/// names map to one variable are ValidateConfig's (config_validate.cc).
void ReadPorts(TableReader& r, const toml::node* n, RoleSpec* role) {
  if (!n || !n->is_array()) {
    std::vector<std::string> none;
    r.StringArray("ports", &none);  // absent, or the type error
    return;
  }
  r.Get("ports");
  static const std::regex kPortName("^[a-z][a-z0-9_]{0,31}$");
  for (const toml::node& e : *n->as_array()) {
    SourcePos pos = PosOf(e.source());
    if (!e.is_string()) {
      r.Error("ports", pos, "wrong element type", "port names as strings", DescribeNode(e),
              "e.g. ports = [\"http\", \"metrics\"]");
      continue;
    }
    std::string name(e.as_string()->get());
    if (!std::regex_match(name, kPortName)) {
      r.Error("ports", pos, "not a valid port name",
              "lower-case letters, digits or '_', starting with a letter, at most 32 ([a-z][a-z0-9_]*)",
              "\"" + name + "\"",
              "e.g. \"http\": the process gets it as DFLASH_PORT_HTTP");
      continue;
    }
    auto same = std::find(role->ports.begin(), role->ports.end(), name);
    if (same != role->ports.end()) {
      r.Error("ports", pos, "duplicate port name \"" + name + "\"", "each port name once",
              "also at " + role->port_pos[static_cast<size_t>(same - role->ports.begin())].ToString(),
              "remove one: each name is one port per process");
      continue;
    }
    role->ports.push_back(std::move(name));
    role->port_pos.push_back(pos);
  }
}

/// nvidia-smi -L's names: "GPU-<uuid>", and for a MIG slice "MIG-<uuid>" (R470+)
/// or "MIG-GPU-<uuid>/<gi>/<ci>" (older drivers). CUDA_VISIBLE_DEVICES takes them as they are.
bool LooksLikeGpuUuid(const std::string& s) {
  static const std::regex kUuid(R"(^(GPU-[0-9a-fA-F-]{8,}|MIG-[0-9a-fA-F-]{8,}|MIG-GPU-[0-9a-fA-F-]{8,}/[0-9]+/[0-9]+)$)");
  return std::regex_match(s, kUuid);
}

/// devices = [0, 2] or ["GPU-…", "MIG-…"] (mixed is allowed): indices 0..1023 or UUIDs.
void ReadDevices(TableReader& r, const toml::node* n, RoleSpec* role) {
  if (n && n->is_array()) {
    r.Get("devices");
    for (const toml::node& e : *n->as_array()) {
      SourcePos pos = PosOf(e.source());
      if (e.is_integer() && e.as_integer()->get() >= 0 && e.as_integer()->get() <= 1023) {
        role->devices.push_back(static_cast<int>(e.as_integer()->get()));
        role->device_uuids.emplace_back();
      } else if (e.is_string() && LooksLikeGpuUuid(e.as_string()->get())) {
        role->devices.push_back(-1);
        role->device_uuids.push_back(e.as_string()->get());
      } else {
        bool digits = e.is_string() && !e.as_string()->get().empty() &&
                      std::all_of(e.as_string()->get().begin(), e.as_string()->get().end(), ::isdigit);
        r.Error("devices", pos,
                e.is_integer() ? "element out of range" : e.is_string() && !digits ? "not a GPU" : "wrong element type",
                "GPU indices 0..1023 or UUIDs as nvidia-smi -L prints them (\"GPU-…\", \"MIG-…\")",
                DescribeNode(e),
                digits ? "remove the quotes around the number"
                       : "e.g. devices = [0, 1] or devices = [\"GPU-5d0f3c1e-8b2a-4f6e-9c1d-2a3b4c5d6e7f\"]");
        continue;
      }
      role->device_pos.push_back(pos);
    }
    return;
  }
  r.IntArray("devices", &role->devices, 0, 1023, &role->device_pos);  // absent, or the type error
}

void ReadRole(const toml::table& t, size_t index, const std::string& base_dir, RoleSpec* role,
              std::vector<ConfigError>* errors) {
  role->pos = PosOf(t.source());
  role->name_pos = t.contains("name") ? PosOf(t.get("name")->source()) : role->pos;
  std::string name_for_path = "role[" + std::to_string(index) + "]";
  if (const toml::node* n = t.get("name"); n && n->is_string() && ValidName(n->as_string()->get(), false))
    name_for_path = "role[" + std::string(n->as_string()->get()) + "]";
  TableReader r(t, "role", name_for_path, errors);
  if (!r.Has("name")) {
    r.Error("name", r.TablePos(), "missing required key", "a role name like \"drafter\"", "nothing",
            "add name = \"...\" to this [[role]]");
  } else if (r.String("name", &role->name) && !ValidName(role->name, false)) {
    r.Error("name", r.ValuePos("name"), "not a valid role name",
            "lower-case letters, digits, '_' or '-', starting with a letter", "\"" + role->name + "\"",
            "e.g. name = \"drafter\"");
  }
  // devices / cpu: exactly one.
  bool has_dev = r.Has("devices"), has_cpu = r.Has("cpu");
  ReadDevices(r, t.get("devices"), role);
  if (has_cpu) r.Int("cpu", &role->cpu, 1, 4096); else r.Get("cpu");
  if (r.Has("nodes")) {
    role->nodes_pos = r.ValuePos("nodes");
    std::vector<SourcePos> node_pos;
    r.IntArray("nodes", &role->nodes, 0, 65535, &node_pos);
    if (const toml::node* n = t.get("nodes"); n && n->is_array() && n->as_array()->empty())
      r.Error("nodes", r.ValuePos("nodes"), "no nodes", "at least one node rank", "[]",
              "remove nodes to run the role on every node, or list ranks like [0, 1]");
    for (size_t i = 1; i < role->nodes.size(); ++i)
      if (role->nodes[i] <= role->nodes[i - 1]) {
        r.Error("nodes", i < node_pos.size() ? node_pos[i] : r.ValuePos("nodes"), "node ranks out of order",
                "strictly ascending node ranks", std::to_string(role->nodes[i]) + " after " +
                    std::to_string(role->nodes[i - 1]),
                "sort them and drop duplicates");
        break;
      }
  } else {
    r.Get("nodes");
  }
  if (has_dev && has_cpu) {
    r.Error("cpu", r.ValuePos("cpu"), "both devices and cpu are set", "exactly one of devices and cpu",
            "devices at " + r.ValuePos("devices").ToString() + " and cpu here",
            "GPU processes: devices = [..]; CPU-only processes: cpu = N");
  } else if (!has_dev && !has_cpu) {
    r.Error("devices", r.TablePos(), "neither devices nor cpu is set", "exactly one of devices and cpu",
            "neither", "e.g. devices = [5, 6, 7] (one process per GPU) or cpu = 3");
  } else if (const toml::node* d = t.get("devices"); d && d->is_array() && d->as_array()->empty()) {
    r.Error("devices", r.ValuePos("devices"), "no devices", "at least one GPU index", "[]",
            "e.g. devices = [0]; or cpu = N for CPU-only processes");
  }
  // command / builtin: exactly one.
  bool has_cmd = r.Has("command"), has_builtin = r.Has("builtin");
  r.StringArray("command", &role->command);
  if (has_cmd) role->command_pos = r.ValuePos("command");
  for (size_t i = 0; i < role->command.size(); ++i) {
    if (role->command[i].find('\0') == std::string::npos) continue;
    r.Error("command", r.ValuePos("command"), "a command argument cannot hold a NUL character (\\u0000)",
            "strings without NUL", "a NUL in argument " + std::to_string(i),
            "remove the \\u0000: execve would cut the argument there");
    role->command.clear();
    break;
  }
  ExpandRefs(r, t.get("command"), "command", &role->command);
  r.Enum("builtin", &role->builtin);
  if (has_cmd && has_builtin) {
    r.Error("builtin", r.ValuePos("builtin"), "both command and builtin are set",
            "exactly one of command and builtin", "command at " + r.ValuePos("command").ToString() + " and builtin here",
            "remove one: builtin runs the LibTorch role, command runs your program");
  } else if (!has_cmd && !has_builtin) {
    r.Error("command", r.TablePos(), "neither command nor builtin is set", "exactly one of command and builtin",
            "neither", "e.g. command = [\"python\", \"train.py\"] or builtin = \"drafter\"");
  } else if (has_cmd) {
    const toml::node* n = t.get("command");
    if (n->is_array() && role->command.empty() && n->as_array()->empty()) {
      r.Error("command", r.ValuePos("command"), "empty command", "the program and its arguments", "[]",
              "e.g. command = [\"python\", \"train.py\"]");
    } else if (!role->command.empty() && role->command[0].empty()) {
      r.Error("command", PosOf((*n->as_array())[0].source()), "empty program name", "a program name or path",
              "\"\"", "e.g. command = [\"python\", \"train.py\"]");
    }
  }
  r.Enum("spool", &role->spool);
  role->spool_pos = r.Has("spool") ? r.ValuePos("spool") : r.Has("builtin") ? r.ValuePos("builtin") : r.TablePos();
  // A builtin role's side of the spool is fixed: a contradicting `spool` is a slip, not a choice.
  const char* fixed = role->builtin == "target" ? "produce" : role->builtin == "drafter" ? "consume" : nullptr;
  if (fixed && (role->spool == "produce" || role->spool == "consume") && role->spool != fixed)
    r.Error("spool", r.ValuePos("spool"), "builtin = \"" + role->builtin + "\" cannot " + role->spool + " frames",
            std::string("\"") + fixed + "\" (or no spool key)", "\"" + role->spool + "\"",
            "remove spool: a builtin " + role->builtin + " " + (std::string(fixed) == "produce" ? "publishes" : "reads") +
                " frames by itself");
  ReadEnv(r, role);
  ReadPorts(r, t.get("ports"), role);
  std::string cwd;
  r.String("cwd", &cwd);
  if (r.Has("cwd")) role->cwd = ResolvePath(cwd, base_dir);
  r.StringArray("warmup", &role->warmup);
  ExpandRefs(r, t.get("warmup"), "warmup", &role->warmup);
  if (r.Has("warmup") && role->warmup.empty() && t.get("warmup")->is_array())
    r.Error("warmup", r.ValuePos("warmup"), "empty warm-up command", "the program and its arguments", "[]",
            "remove warmup to use the role's command with DFLASH_WARMUP=1");
  ReadGate(r.Get("gate"), name_for_path, &role->gate, errors, r);
  if (!r.Has("gate")) {
    static const toml::table empty;
    TableReader g(empty, "role.gate", name_for_path + ".gate", errors);
    g.Duration("timeout", &role->gate.timeout);
    g.Duration("idle_hint", &role->gate.idle_hint, true);
  }
  bool ready_given = false;
  ReadReady(r.Get("ready"), name_for_path, &role->ready, errors, r, &ready_given);
  if (!ready_given && role->gate.enabled) role->ready.mode = ReadyMode::kNotify;
  if (role->gate.enabled && ready_given && role->ready.mode == ReadyMode::kNone)
    r.Error("ready", r.ValuePos("ready"), "a gated role needs a readiness signal",
            "ready = \"notify\", \"log\", \"file\" or \"exit\"", "\"none\"",
            "the gate is released when the leader is ready: ready = \"notify\" and call "
            "dflash_launch.notify_ready() after the first compiled step");
  if (role->gate.enabled && role->ready.probes())
    r.Error("ready", r.ValuePos("ready"), "a gated role cannot be probed for readiness",
            "ready = \"notify\", \"log\", \"file\" or \"exit\" (with a gate)",
            std::string("\"") + ReadyModeName(role->ready.mode) + "\"",
            "the gate's leader is judged by dflash-worker, which does not probe: call "
            "dflash_launch.notify_ready() once the server listens (ready = \"notify\"), or gate = false");
  ReadRestart(r.Get("restart"), name_for_path, &role->restart, errors, r);
  ReadStop(r.Get("stop"), name_for_path, &role->stop, errors, r);
  std::string world;
  r.Enum("world", &world);
  role->world = TorchWorld::kNone;  // an unknown value was reported: the default stands in
  ParseIn(kTorchWorldNames, world, &role->world);
  if (r.Has("world")) role->world_pos = r.ValuePos("world");
  r.Duration("watchdog", &role->watchdog, /*allow_zero=*/true);
  r.Signal("watchdog_signal", &role->watchdog_signal);
  if (r.StringArray("after", &role->after)) {
    role->after_pos.clear();
    if (const toml::node* n = t.get("after"); n && n->is_array())
      for (const toml::node& e : *n->as_array()) role->after_pos.push_back(PosOf(e.source()));
    role->after_pos.resize(role->after.size(), r.ValuePos("after"));
  }
  r.Bool("service", &role->service);
  if (r.Has("service")) role->service_pos = r.ValuePos("service");
  ReadLiveness(r.Get("liveness"), name_for_path, &role->liveness, errors, r);
  CheckProbePortName(r, "ready", role->ready.probe, *role);
  if (role->liveness.enabled) CheckProbePortName(r, "liveness", role->liveness.probe, *role);
  r.RejectUnknownKeys();
}

}  // namespace

bool LoadConfigFromString(std::string_view text, const std::string& path, RunConfig* out,
                          std::vector<ConfigError>* errors) {
  *out = RunConfig{};
  out->path = path;
  errors->clear();
  int bad_line = 0, bad_col = 0;
  std::string bad, bad_hint;
  if (!ScreenTomlText(text, &bad_line, &bad_col, &bad, &bad_hint)) {
    errors->push_back({{path, bad_line, bad_col}, "", bad, "valid TOML", "", bad_hint});
    return false;
  }
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    SourcePos pos = PosOf(e.source());
    if (pos.file.empty()) pos.file = path;
    errors->push_back({pos, "", "TOML syntax: " + std::string(e.description()), "valid TOML", "", 
                       "check the line above too: an unclosed quote or bracket often shows up here"});
    return false;
  }
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  std::string base_dir = abs.parent_path().string();

  // Top level: [run], [model], [[role]].
  const toml::table* run_table = nullptr;
  for (auto&& [k, v] : root) {
    std::string key(k.str());
    if (key == "run" || key == "model") {
      if (!v.is_table())
        errors->push_back({PosOf(k.source()), key, "must be a table", "[" + key + "] with keys below it",
                           DescribeNode(v), "write [" + key + "] on its own line, then its keys"});
      else if (key == "run") run_table = v.as_table();
      continue;
    }
    if (key == "role") {
      if (v.is_table()) {
        errors->push_back({PosOf(k.source()), "role", "roles are an array of tables", "[[role]]", "[role]",
                           "write [[role]] (double brackets) for each role"});
      } else if (!v.is_array() || !v.as_array()->is_array_of_tables()) {
        errors->push_back({PosOf(k.source()), "role", "wrong type", "[[role]] tables", DescribeNode(v),
                           "write [[role]] (double brackets) for each role"});
      }
      continue;
    }
    std::string hint;
    std::vector<std::string_view> top = {"run", "model", "role"};
    std::string close = ClosestName(key, top);
    if (key == "roles") close = "role";
    if (!close.empty()) {
      hint = close == "role" ? "did you mean [[role]]?" : "did you mean [" + close + "]?";
    } else {
      for (const SectionSpec& s : Schema())
        if (s.name.find('.') == std::string_view::npos && FindKey(s.name, key)) {
          hint = "`" + key + "` belongs in " + (s.name == "role" ? "a [[role]]" : "[" + std::string(s.name) + "]") +
                 ": keys above the first [table] header are top-level";
          break;
        }
      if (hint.empty()) hint = "the top level has [run], [model] and [[role]] tables";
    }
    errors->push_back({PosOf(k.source()), key, "unknown key", "[run], [model] or [[role]]", "`" + key + "`", hint});
  }

  ReadRun(run_table, path, base_dir, &out->run, errors);
  if (const toml::node* m = root.get("model"); m && m->is_table()) ReadModel(*m->as_table(), &out->model, errors);
  if (const toml::node* roles = root.get("role"); roles && roles->is_array() && roles->as_array()->is_array_of_tables()) {
    size_t i = 0;
    for (const toml::node& rt : *roles->as_array()) {
      RoleSpec role;
      ReadRole(*rt.as_table(), i++, base_dir, &role, errors);
      out->roles.push_back(std::move(role));
    }
  }
  ValidateConfig(root, out, errors);
  return errors->empty();
}

bool LoadConfig(const std::string& path, RunConfig* out, std::vector<ConfigError>* errors) {
  std::string text, err;
  errors->clear();
  if (!ReadFile(path, &text, &err)) {
    errors->push_back({{path, 0, 0}, "", "cannot read the config: " + err, "a readable TOML file", "", 
                       "check the path; e.g. dflash-launch check configs/demo.toml"});
    return false;
  }
  return LoadConfigFromString(text, path, out, errors);
}

}  // namespace dflash

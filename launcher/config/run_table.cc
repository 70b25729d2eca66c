// [run]: the run's name and directories, the rendezvous (master_addr, master_port, nnodes), the signals
// it forwards and the store (private or redis://, its timings, where its password is).
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "common/duration.h"
#include "common/signal_names.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/metrics_address.h"
#include "store/redis_client.h"

namespace dflash {
namespace fs = std::filesystem;

namespace {

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

/// metrics: an address, or false (off). true is the default address; both spellings in one key.
void ReadMetrics(TableReader& r, RunSpec* run) {
  const toml::node* n = r.Get("metrics");
  run->metrics = kDefaultMetricsAddress;
  if (!n) return;
  run->metrics_pos = r.ValuePos("metrics");
  const std::string hint = "e.g. metrics = \"127.0.0.1:9400\" (port 0: a free one), or metrics = false";
  if (n->is_boolean()) {
    if (!n->as_boolean()->get()) run->metrics.clear();
    return;
  }
  if (!n->is_string()) {
    std::string port = n->is_integer() ? std::to_string(n->as_integer()->get()) : "9400";
    r.Error("metrics", r.ValuePos("metrics"), "wrong type", DescribeType(*FindKey("run", "metrics")),
            DescribeNode(*n), "an address in quotes, with its IP: metrics = \"127.0.0.1:" + port + "\", or false");
    return;
  }
  std::string why;
  if (!ValidMetricsAddress(n->as_string()->get(), &why)) {
    r.Error("metrics", r.ValuePos("metrics"), "not an address", "\"IP:PORT\" (IPv6: \"[::1]:PORT\")",
            DescribeNode(*n), why + "; " + hint);
    return;
  }
  run->metrics = n->as_string()->get();
}

void ReadSpoolMaxBytes(TableReader& r, RunSpec* run) {
  run->spool_max_bytes_pos = r.ValuePos("spool_max_bytes");
  if (!r.Has("spool_max_bytes")) {
    r.Get("spool_max_bytes");
    return;
  }
  int64_t v = 0;
  if (!r.Int64("spool_max_bytes", &v)) return;
  if (v <= 0) {
    r.Error("spool_max_bytes", r.ValuePos("spool_max_bytes"), "out of range", "a positive number of bytes",
            std::to_string(v), "e.g. spool_max_bytes = 8_000_000_000 (remove the key for half the free space)");
    return;
  }
  run->spool_max_bytes = v;
}

}  // namespace

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
  if (r.Has("checkpoint_dir")) {
    std::string ckpt;
    r.String("checkpoint_dir", &ckpt);
    if (ckpt.empty())
      r.Error("checkpoint_dir", r.ValuePos("checkpoint_dir"), "empty path", "a directory path", "\"\"",
              "remove the key to take the default (<run_dir>/checkpoints)");
    else
      run->checkpoint_dir = ResolvePath(ckpt, base_dir);
  } else {
    r.Get("checkpoint_dir");
  }
  run->spool_dir_pos = r.ValuePos("spool_dir");
  ReadSpoolMaxBytes(r, run);
  if (r.Has("log_group")) r.String("log_group", &run->log_group); else r.Get("log_group");
  r.String("master_addr", &run->master_addr);
  run->master_addr_given = r.Has("master_addr");
  ReadMasterPort(r, run);
  if (r.Has("nnodes")) r.Int("nnodes", &run->nnodes, 1, 65536); else r.Get("nnodes");
  r.SignalArray("forward_signals", &run->forward_signals);
  r.Bool("share_gpus", &run->share_gpus);
  r.Bool("console_dedup", &run->console_dedup);
  ReadMetrics(r, run);
  ReadStore(r, base_dir, run);
  r.SignalArray("stop_signals", &run->stop_signals);
  for (const char* key : {"forward_signals", "stop_signals"}) {
    const toml::node* n = t ? t->get(key) : nullptr;
    if (!n || !n->is_array()) continue;
    const bool stop = std::string_view(key) == "stop_signals";
    for (const toml::node& e : *n->as_array()) {
      int sig = e.is_string() ? SignalFromName(e.as_string()->get()) : 0;
      if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD)
        r.Error(key, PosOf(e.source()), stop ? "this signal cannot stop the run" : "this signal cannot be forwarded",
                "a catchable signal such as \"SIGUSR1\" or \"SIGUSR2\"", DescribeNode(e),
                "SIGKILL and SIGSTOP cannot be caught and SIGCHLD is the supervisor's own");
      else if (stop && (sig == SIGINT || sig == SIGTERM || sig == SIGHUP))
        r.Error(key, PosOf(e.source()), "this signal stops the run already", "a signal such as \"SIGUSR1\"",
                DescribeNode(e), "SIGINT, SIGTERM and SIGHUP always stop the run: leave them out");
      else if (stop && sig != 0 &&
               std::find(run->forward_signals.begin(), run->forward_signals.end(), sig) != run->forward_signals.end())
        r.Error(key, PosOf(e.source()), "this signal is also in forward_signals", "each signal in one list",
                DescribeNode(e),
                "a stop signal stops the run (each process gets its stop.signal and checkpoints); a forwarded one "
                "is passed through and the run goes on: choose one");
    }
  }
  r.RejectUnknownKeys();
}

}  // namespace dflash

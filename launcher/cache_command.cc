// `dflash-launch cache status|export|import|clear run.toml`: the compile cache
// the config points at. Everything that writes it does so under the gate.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <set>

#include "cachelock/gate.h"
#include "cachelock/records.h"
#include "cachelock/status.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "launcher/cache_archive.h"
#include "launcher/cache_inventory.h"
#include "launcher/commands.h"
#include "launcher/torch_version.h"

namespace dflash {
namespace fs = std::filesystem;
namespace {

void Say(const std::string& line) { std::fprintf(stderr, "dflash-launch: %s\n", line.c_str()); }

std::string Stamp() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

int Status(const Plan& plan, bool json) {
  const std::string& dir = plan.config.run.cache_dir;
  CacheInventory inv = ScanCache(dir);
  GateStatusReport gate;
  std::string err;
  if (!ReadGateStatus(dir, &gate, &err)) {
    Say(err);
    return exit_code::kCannotCreate;
  }
  double now = static_cast<double>(std::time(nullptr));
  std::set<std::string> torch;
  for (const ReadyRecord& r : gate.ready)
    if (!r.torch_version.empty()) torch.insert(r.torch_version);
  if (json) {
    nlohmann::json j = {{"cache_dir", dir}, {"inventory", inv.ToJson()}, {"gate", StatusJson(gate, now)},
                        {"torch_versions", torch}, {"roles", nlohmann::json::array()}};
    for (const ProcessPlan& p : plan.processes) {
      if (p.role_rank != 0 || p.gate_key.empty()) continue;
      bool ready = std::any_of(gate.ready.begin(), gate.ready.end(), [&](const ReadyRecord& r) { return r.key == p.gate_key; });
      j["roles"].push_back({{"role", p.role}, {"key", p.gate_key}, {"ready", ready}});
    }
    std::cout << j.dump(2) << "\n";
    return exit_code::kOk;
  }
  std::cout << "cache " << dir << (inv.exists ? "" : " (does not exist yet)") << "\n";
  std::cout << "  content  " << inv.total_files << " files: " << inv.Describe() << "\n";
  std::string torch_list;
  for (const std::string& t : torch) torch_list += (torch_list.empty() ? "" : ", ") + t;
  std::cout << "  torch    " << (torch_list.empty() ? "unknown (no READY record)" : torch_list + " (from the READY records)")
            << "\n";
  for (const ProcessPlan& p : plan.processes) {
    if (p.role_rank != 0 || p.gate_key.empty()) continue;
    bool ready = std::any_of(gate.ready.begin(), gate.ready.end(), [&](const ReadyRecord& r) { return r.key == p.gate_key; });
    std::cout << "  role     " << p.role << ": key " << p.gate_key
              << (ready ? " (READY: the next run reuses)" : " (no READY: the next run compiles)") << "\n";
  }
  std::cout << StatusText(gate, now);
  return exit_code::kOk;
}

/// The gate of the cache, held for maintenance until destroyed.
struct HeldGate {
  std::unique_ptr<CompileGate> gate;
  ~HeldGate() {
    if (gate) gate->Release();
  }
};

int TakeGate(const std::string& dir, const std::string& purpose, Millis timeout, HeldGate* held) {
  std::string err;
  if (!MakeDirs(dir, 0700, &err)) {
    Say(err);
    return exit_code::kCannotCreate;
  }
  GateOptions o;
  o.dir = dir;
  o.role = "dflash-launch " + purpose;
  o.timeout = timeout;
  o.on_progress = [](std::string_view line) { Say(std::string(line)); };
  if (GateError e = CompileGate::Open(o, &held->gate, &err); e != GateError::kOk) {
    Say(err);
    return GateExitCode(e);
  }
  if (GateError e = held->gate->Hold(purpose, &err); e != GateError::kOk) {
    Say(err);
    held->gate.reset();
    return GateExitCode(e);
  }
  return exit_code::kOk;
}

int Export(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  if (!ScanCache(dir).exists) {
    Say("cache " + dir + " does not exist: nothing to export");
    return exit_code::kFailure;
  }
  HeldGate held;  // nobody compiles into it while we read it
  if (int rc = TakeGate(dir, "cache-export", o.timeout, &held)) return rc;
  nlohmann::json manifest;
  std::string err;
  if (!ExportCache(dir, o.file, {CacheTorchVersion(plan), DeviceKind(plan.config)}, &manifest, &err)) {
    Say(err);
    return exit_code::kFailure;
  }
  struct stat st {};
  ::stat(o.file.c_str(), &st);
  std::cout << "exported " << manifest["files"].size() << " files and " << manifest["keys"].size()
            << " READY key(s) of " << dir << " to " << o.file << " (" << HumanBytes(static_cast<uint64_t>(st.st_size))
            << ", torch " << manifest["torch_version"].get<std::string>() << ", " << manifest["device"].get<std::string>()
            << ")\n";
  return exit_code::kOk;
}

int Import(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  ArchiveFacts here{CacheTorchVersion(plan), DeviceKind(plan.config)};
  // Check before waiting for the gate: a wrong archive is refused at once.
  nlohmann::json manifest;
  std::string err;
  if (!ReadArchiveManifest(o.file, &manifest, &err)) {
    Say("refused: " + err + "; the cache is untouched");
    return exit_code::kFailure;
  }
  HeldGate held;  // a running compile finishes first; nobody reads a half-imported cache
  if (int rc = TakeGate(dir, "cache-import", o.timeout, &held)) return rc;
  ImportResult r = ImportCache(o.file, dir, here, o.force, &manifest, &err);
  if (r != ImportResult::kOk) {
    Say("refused: " + err + "; the cache is untouched");
    return exit_code::kFailure;
  }
  std::cout << "imported " << manifest["files"].size() << " files and " << manifest["keys"].size()
            << " READY key(s) into " << dir << " (torch " << manifest.value("torch_version", "?") << ")\n";
  return exit_code::kOk;
}

int Clear(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  if (!ScanCache(dir).exists) {
    std::cout << "cache " << dir << " does not exist: nothing to clear\n";
    return exit_code::kOk;
  }
  std::string err;
  if (!o.key.empty()) {
    // One key: its READY goes (the next run of that key compiles); the entries stay (content-addressed).
    if (!ValidGateKey(o.key, &err)) {
      Say(err);
      return exit_code::kUsage;
    }
    GateOptions g;
    g.dir = dir;
    g.role = "dflash-launch cache-clear";
    g.timeout = o.timeout;
    g.on_progress = [](std::string_view line) { Say(std::string(line)); };
    std::unique_ptr<CompileGate> gate;
    if (GateError e = CompileGate::Open(g, &gate, &err); e != GateError::kOk) {
      Say(err);
      return GateExitCode(e);
    }
    bool existed = false;
    if (GateError e = gate->Forget(o.key, &existed, &err); e != GateError::kOk) {
      Say(err);
      return GateExitCode(e);
    }
    std::cout << (existed ? "cleared READY(" + o.key + "): the next run of that key compiles\n"
                          : "READY(" + o.key + ") was not there\n");
    return exit_code::kOk;
  }
  HeldGate held;  // never under a running compile
  if (int rc = TakeGate(dir, "cache-clear", o.timeout, &held)) return rc;
  // Promises first: with no READY left, nobody trusts what remains. Then each
  // top-level entry is renamed aside in one step (a reader sees it whole or
  // not at all) and deleted there, out of every reader's path.
  fs::path trash = fs::path(dir) / ".dflash" / ("trash-" + Stamp() + "-" + std::to_string(::getpid()));
  std::error_code ec;
  if (!MakeDirs(trash.string(), 0700, &err)) {
    Say(err);
    return exit_code::kCannotCreate;
  }
  if (fs::exists(fs::path(dir) / ".dflash/ready", ec) &&
      ::rename((fs::path(dir) / ".dflash/ready").c_str(), (trash / "ready").c_str()) != 0) {
    Say(ErrnoMessage("rename(READY markers)", errno));
    return exit_code::kFailure;
  }
  if (!MakeDirs((fs::path(dir) / ".dflash/ready").string(), 0700, &err)) {
    Say(err);
    return exit_code::kCannotCreate;
  }
  CacheInventory before = ScanCache(dir);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() == ".dflash") continue;
    if (::rename(e.path().c_str(), (trash / e.path().filename()).c_str()) != 0) {
      Say(ErrnoMessage("rename(" + e.path().string() + ")", errno));
      return exit_code::kFailure;
    }
  }
  fs::remove_all(trash, ec);
  std::cout << "cleared " << dir << ": " << before.Describe() << "\n";
  return exit_code::kOk;
}

}  // namespace

std::string DeviceKind(const RunConfig& config) {
  for (const RoleSpec& r : config.roles)
    if (!r.is_cpu()) return "cuda";
  return "cpu";
}

std::string CacheTorchVersion(const Plan& plan) {
  const RunConfig& c = plan.config;
  for (size_t i = 0; i < c.roles.size(); ++i)
    if (c.roles[i].gate.enabled) return plan.role_torch_version[i];
  // No gated role: ask the first role's Python (what would compile into the cache).
  return c.roles.empty() ? "unknown" : TorchVersionFor(c.roles[0]);
}

int RunCache(const CacheOptions& o, char** env) {
  Plan plan;
  if (!LoadPlanOrReport(o.config, "cache", o.bin_dir, env, &plan)) return exit_code::kConfig;
  if (o.action == "status") return Status(plan, o.json);
  if (o.action == "export") return Export(plan, o);
  if (o.action == "import") return Import(plan, o);
  return Clear(plan, o);
}

}  // namespace dflash

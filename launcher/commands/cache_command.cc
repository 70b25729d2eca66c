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
#include "common/secure_path.h"
#include "cachelock/archive_key.h"
#include "cachelock/cache_archive.h"
#include "launcher/commands/cache_clear.h"
#include "cachelock/cache_inventory.h"
#include "launcher/commands/commands.h"
#include "launcher/commands/front_door.h"
#include "launcher/plan/torch_version.h"

namespace dflash {
namespace fs = std::filesystem;
namespace {

void SayLine(const std::string& line) { std::fprintf(stderr, "dflash-launch: %s\n", line.c_str()); }

/// The command's failure, said once by RunCache (front_door.h's Say) with the code it exits with.
Status CacheError(int exit_code, const std::string& line) {
  return Status::Error(exit_code, "dflash-launch: " + line + "\n");
}

Status ShowStatus(const Plan& plan, bool json) {
  const std::string& dir = plan.config.run.cache_dir;
  CacheInventory inv = ScanCache(dir);
  GateStatusReport gate;
  std::string err;
  if (!ReadGateStatus(dir, &gate, &err)) {
    return CacheError(exit_code::kCannotCreate, err);
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
    return Status::Ok();
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
  return Status::Ok();
}

/// The gate of the cache, held for maintenance until destroyed.
struct HeldGate {
  std::unique_ptr<CompileGate> gate;
  ~HeldGate() {
    if (gate) gate->Release();
  }
};

Status TakeGate(const std::string& dir, const std::string& purpose, Millis timeout, HeldGate* held) {
  std::string err;
  if (!MakeDirs(dir, 0700, &err)) {
    return CacheError(exit_code::kCannotCreate, err);
  }
  GateOptions o;
  o.dir = dir;
  o.role = "dflash-launch " + purpose;
  o.timeout = timeout;
  o.on_progress = [](std::string_view line) { SayLine(std::string(line)); };
  if (GateError e = CompileGate::Open(o, &held->gate, &err); e != GateError::kOk) {
    return CacheError(GateExitCode(e), err);
  }
  if (GateError e = held->gate->Hold(purpose, &err); e != GateError::kOk) {
    held->gate.reset();
    return CacheError(GateExitCode(e), err);
  }
  return Status::Ok();
}

/// The cache dir must be ours, reached only through links and parents that nobody else
/// controls (exit 73 otherwise, with the fix). An absent dir passes: nothing to act on.
Status CheckCacheDir(const std::string& dir) {
  std::string err;
  if (!CheckSecurePath(dir, &err)) {
    return CacheError(exit_code::kCannotCreate, err);
  }
  return Status::Ok();
}

Status Export(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  if (Status s = CheckCacheDir(dir); !s.ok()) return s;
  if (!ScanCache(dir).exists) {
    return CacheError(exit_code::kFailure, "cache " + dir + " does not exist: nothing to export");
  }
  // Signed with the user's own key: an archive is code, and `cache import` takes only what its user signed.
  std::string key, err;
  if (!LoadArchiveKey(/*create=*/true, &key, &err)) {
    return CacheError(exit_code::kCannotCreate, "cannot sign the archive: " + err);
  }
  HeldGate held;  // nobody compiles into it while we read it
  if (Status s = TakeGate(dir, "cache-export", o.timeout, &held); !s.ok()) return s;
  ExportReport report;
  if (!ExportCache(dir, o.file, {CacheTorchVersion(plan), DeviceKind(plan.config), CacheGpuIdentity(plan), CacheCpuIdentity(plan)}, &report,
                   &err, key)) {
    return CacheError(exit_code::kFailure, "export failed: " + err);
  }
  for (size_t i = 0; i < report.skipped.size() && i < 20; ++i) SayLine("skipped " + report.skipped[i]);
  if (report.skipped.size() > 20) SayLine("skipped " + std::to_string(report.skipped.size() - 20) + " more");
  const CacheManifest& m = report.manifest;
  std::cout << "exported " << m.files.size() << " files and " << m.keys.size() << " READY key(s) of " << dir
            << " to " << o.file << " (" << HumanBytes(report.archive_bytes) << ", torch " << m.torch_version << ", "
            << m.device << "; signed with " << ArchiveKeyPath() << ")\n";
  return Status::Ok();
}

Status Import(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  if (Status s = CheckCacheDir(dir); !s.ok()) return s;
  ArchiveFacts here{CacheTorchVersion(plan), DeviceKind(plan.config), CacheGpuIdentity(plan), CacheCpuIdentity(plan)};
  // Check before waiting for the gate: a wrong archive is refused at once.
  CacheManifest manifest;
  std::string err;
  if (!ReadArchiveManifest(o.file, &manifest, &err)) {
    return CacheError(exit_code::kFailure, "refused: " + err + "; the cache is untouched");
  }
  // An archive is code: signed with this user's key, or vouched for by --trust (cachelock/archive_key.h).
  ArchiveTrust trust;
  trust.vouched = o.trust;
  if (std::string kerr; !trust.vouched && !LoadArchiveKey(/*create=*/false, &trust.key, &kerr)) trust.key.clear();
  if (CheckArchiveTrust(o.file, trust, &err) != ImportResult::kOk) {
    return CacheError(exit_code::kFailure, "refused: " + o.file + ": " + err + "; the cache is untouched");
  }
  HeldGate held;  // a running compile finishes first; nobody reads a half-imported cache
  if (Status s = TakeGate(dir, "cache-import", o.timeout, &held); !s.ok()) return s;
  ImportReport r;
  if (ImportCache(o.file, dir, here, o.force, trust, &r, &err) != ImportResult::kOk) {
    if (r.cache_changed)
      return CacheError(exit_code::kFailure, "import failed: " + err + "; rolling back also failed (" +
                                                 r.rollback_error + "): some imported files remain in " + dir +
                                                 ", but no READY marker was installed");
    if (r.rolled_back)
      return CacheError(exit_code::kFailure, "import failed: " + err +
                                                 "; the files already renamed in were taken out again: the cache is as it was");
    return CacheError(exit_code::kFailure, "refused: " + err + "; the cache is untouched");
  }
  std::cout << "imported " << r.manifest.files.size() << " files and " << r.manifest.keys.size()
            << " READY key(s) into " << dir << " (torch " << r.manifest.torch_version << ")\n";
  return Status::Ok();
}

Status Clear(const Plan& plan, const CacheOptions& o) {
  const std::string& dir = plan.config.run.cache_dir;
  if (Status s = CheckCacheDir(dir); !s.ok()) return s;
  if (!ScanCache(dir).exists) {
    std::cout << "cache " << dir << " does not exist: nothing to clear\n";
    return Status::Ok();
  }
  std::string err;
  if (!o.key.empty()) {
    // One key: its READY goes (the next run of that key compiles); the entries stay (content-addressed).
    if (!ValidGateKey(o.key, &err)) {
      return CacheError(exit_code::kUsage, err);
    }
    GateOptions g;
    g.dir = dir;
    g.role = "dflash-launch cache-clear";
    g.timeout = o.timeout;
    g.on_progress = [](std::string_view line) { SayLine(std::string(line)); };
    std::unique_ptr<CompileGate> gate;
    if (GateError e = CompileGate::Open(g, &gate, &err); e != GateError::kOk) {
      return CacheError(GateExitCode(e), err);
    }
    bool existed = false;
    if (GateError e = gate->Forget(o.key, &existed, &err); e != GateError::kOk) {
      return CacheError(GateExitCode(e), err);
    }
    std::cout << (existed ? "cleared READY(" + o.key + "): the next run of that key compiles\n"
                          : "READY(" + o.key + ") was not there\n");
    return Status::Ok();
  }
  HeldGate held;  // never under a running compile
  if (Status s = TakeGate(dir, "cache-clear", o.timeout, &held); !s.ok()) return s;
  ClearReport report;
  bool ok = ClearCache(dir, &report, &err);
  std::cout << (ok ? "cleared " : "clear stopped in ") << dir << ": " << report.Describe() << "\n";
  if (!report.left.empty()) {
    std::cout << "left " << report.left.size() << " entr" << (report.left.size() == 1 ? "y" : "ies")
              << " that Inductor, Triton and the gate did not write (not touched):";
    for (size_t i = 0; i < report.left.size() && i < 20; ++i) {
      const auto& [path, files] = report.left[i];
      std::cout << (i ? ", " : " ") << path;
      if (path.back() == '/') std::cout << " (" << files << " file" << (files == 1 ? "" : "s") << ")";
    }
    if (report.left.size() > 20) std::cout << " and " << report.left.size() - 20 << " more";
    std::cout << "\n";
  }
  if (!ok) {
    return CacheError(exit_code::kFailure, "clear failed: " + err);
  }
  return Status::Ok();
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
    if (c.roles[i].gate.enabled) return plan.roles[i].torch_version;
  // No gated role: ask the first role's Python (what would compile into the cache).
  return c.roles.empty() ? "unknown" : TorchVersionFor(c.roles[0]);
}

std::string CacheGpuIdentity(const Plan& plan) {
  const RunConfig& c = plan.config;
  for (size_t i = 0; i < c.roles.size(); ++i)
    if (c.roles[i].gate.enabled) return plan.roles[i].gpu_identity;
  return "";  // no gated role: unknown, not checked
}

std::string CacheCpuIdentity(const Plan& plan) {
  const RunConfig& c = plan.config;
  for (size_t i = 0; i < c.roles.size(); ++i)
    if (c.roles[i].gate.enabled) return plan.roles[i].cpu_identity;
  // No gated role: the first role's, since every process's Inductor keys carry its CPU (common/cpu_identity.h).
  return plan.roles.empty() ? "" : plan.roles[0].cpu_identity;
}

int RunCache(const CacheOptions& o, char** env) {
  Plan plan;
  if (Status s = LoadPlan(o.config, "cache", o.bin_dir, env, &plan); !s.ok()) return Say(s);
  if (o.action == "status") return Say(ShowStatus(plan, o.json));
  if (o.action == "export") return Say(Export(plan, o));
  if (o.action == "import") return Say(Import(plan, o));
  return Say(Clear(plan, o));
}

}  // namespace dflash

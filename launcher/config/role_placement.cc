// Where a [[role]]'s processes run and what they listen on: devices or cpu (exactly one), nodes, and named ports.
#include <algorithm>
#include <cctype>
#include <regex>

#include "launcher/config/config_internal.h"

namespace dflash {

namespace {

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

/// nodes = [0, 2]: strictly ascending node ranks; absent, every node.
void ReadNodes(TableReader& r, const toml::table& t, RoleSpec* role) {
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
}

}  // namespace

void ReadPlacement(TableReader& r, const toml::table& t, RoleSpec* role) {
  // devices / cpu: exactly one.
  bool has_dev = r.Has("devices"), has_cpu = r.Has("cpu");
  ReadDevices(r, t.get("devices"), role);
  if (has_cpu) r.Int("cpu", &role->cpu, 1, 4096); else r.Get("cpu");
  ReadNodes(r, t, role);
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

}  // namespace dflash

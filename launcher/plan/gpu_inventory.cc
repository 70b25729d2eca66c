#include "launcher/plan/gpu_inventory.h"

#include <dlfcn.h>

#include <cstdio>

namespace dflash {
namespace {

// The few NVML entry points we call, with their C types (nvml.h is not needed to build).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;

const char* ComputeModeName(int mode) {
  switch (mode) {  // nvmlComputeMode_t
    case 0: return "default";
    case 1: return "exclusive-thread";
    case 2: return "prohibited";
    case 3: return "exclusive-process";
    default: return "unknown";
  }
}

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

GpuInventory ProbeGpus() {
  GpuInventory inv;
  // RTLD_LOCAL: its symbols stay out of the launcher's namespace.
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    inv.why_not = "libnvidia-ml.so.1 not found (no NVIDIA driver here)";
    return inv;
  }
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*get_uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*get_memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*get_mode)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*get_capability)(nvmlDevice_t, int*, int*) = nullptr;  // optional: R4xx+
  if (!Sym(lib, "nvmlInit_v2", &init) || !Sym(lib, "nvmlShutdown", &shutdown) ||
      !Sym(lib, "nvmlDeviceGetCount_v2", &count) || !Sym(lib, "nvmlDeviceGetHandleByIndex_v2", &by_index) ||
      !Sym(lib, "nvmlDeviceGetName", &get_name) || !Sym(lib, "nvmlDeviceGetUUID", &get_uuid) ||
      !Sym(lib, "nvmlDeviceGetMemoryInfo", &get_memory) || !Sym(lib, "nvmlDeviceGetComputeMode", &get_mode)) {
    inv.why_not = "libnvidia-ml.so.1 lacks an NVML function we need (a very old driver?)";
    ::dlclose(lib);
    return inv;
  }
  Sym(lib, "nvmlDeviceGetCudaComputeCapability", &get_capability);
  if (nvmlReturn_t rc = init(); rc != kNvmlSuccess) {
    inv.why_not = "nvmlInit failed (NVML error " + std::to_string(rc) + ": is the driver loaded?)";
    ::dlclose(lib);
    return inv;
  }
  unsigned n = 0;
  if (count(&n) == kNvmlSuccess) {
    inv.nvml = true;
    for (unsigned i = 0; i < n; ++i) {
      GpuInfo g;
      g.index = static_cast<int>(i);
      nvmlDevice_t d = nullptr;
      if (by_index(i, &d) != kNvmlSuccess) {
        g.name = "unknown (NVML could not open it)";
        inv.gpus.push_back(g);
        continue;
      }
      char buf[96] = {};
      if (get_name(d, buf, sizeof buf) == kNvmlSuccess) g.name = buf;
      char ubuf[96] = {};
      if (get_uuid(d, ubuf, sizeof ubuf) == kNvmlSuccess) g.uuid = ubuf;
      NvmlMemory mem{};
      if (get_memory(d, &mem) == kNvmlSuccess) g.memory_bytes = mem.total;
      int major = 0, minor = 0;
      if (get_capability && get_capability(d, &major, &minor) == kNvmlSuccess)
        g.capability = std::to_string(major) + "." + std::to_string(minor);
      int mode = -1;
      g.compute_mode = get_mode(d, &mode) == kNvmlSuccess ? ComputeModeName(mode) : "unknown";
      inv.gpus.push_back(g);
    }
  } else {
    inv.why_not = "nvmlDeviceGetCount failed";
  }
  shutdown();
  ::dlclose(lib);
  return inv;
}

std::string DescribeGpu(const GpuInfo& g) {
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.0f GiB", static_cast<double>(g.memory_bytes) / (1024.0 * 1024 * 1024));
  return (g.name.empty() ? std::string("unknown model") : g.name) + ", " + mem +
         (g.capability.empty() ? "" : ", sm " + g.capability) + ", " + g.compute_mode;
}

}  // namespace dflash

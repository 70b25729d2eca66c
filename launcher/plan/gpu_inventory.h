// The host's GPUs as NVML sees them (index = PCI bus order, which CUDA_DEVICE_ORDER=PCI_BUS_ID
// gives the processes): `check` and `run` refuse an index past the count and name each GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct GpuInfo {
  int index = 0;
  std::string name;          // "NVIDIA H200"
  std::string uuid;          // "GPU-…"
  uint64_t memory_bytes = 0;
  std::string capability;    // "9.0" (empty: the driver does not say)
  std::string compute_mode;  // "default", "exclusive-process", "prohibited", "exclusive-thread"
};

struct GpuInventory {
  bool nvml = false;    // NVML answered; false: `why_not` says why (no driver, a CPU host)
  std::string why_not;
  std::vector<GpuInfo> gpus;
};

/// dlopen("libnvidia-ml.so.1") -- never linked, so a CPU host needs no driver --
/// then init, read every GPU, shut down and dlclose: nothing of NVML stays in
/// the launcher (no mapping, no open device fds) once this returns.
GpuInventory ProbeGpus();

/// "NVIDIA H200, 141 GiB, sm 9.0, exclusive-process"
std::string DescribeGpu(const GpuInfo& g);

}  // namespace dflash

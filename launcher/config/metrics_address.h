// [run] metrics: where a live run serves its Prometheus metrics. "IP:PORT" (IPv4) or "[IPv6]:PORT";
// port 0 takes a free one. Checked as the config is read, so a typo never reaches a run.
#pragma once

#include <string>

namespace dflash {

/// The default: loopback, a free port (the URL is in `ctl status --json` and <run_dir>/metrics.url).
inline constexpr const char* kDefaultMetricsAddress = "127.0.0.1:0";

/// False with `err` (what is wrong, in words) unless `address` is an IP literal and a port 0-65535.
bool ValidMetricsAddress(const std::string& address, std::string* err);

}  // namespace dflash

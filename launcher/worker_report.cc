#include "launcher/worker_report.h"

#include <cctype>
#include <cstdlib>

namespace dflash {

/// What the notify socket says, decoded in this one place (the protocol's
/// field names: worker/gated_run.cc sends them).
WorkerReport ReportFromNotify(const NotifyMessage& m) {
  WorkerReport r;
  for (const auto& [k, v] : m.fields) {
    if (k == "MAINPID") r.main_pid = std::atoi(v.c_str());
    else if (k == "X_DFLASH_ERROR") r.error = v;
    else if (k == "X_DFLASH_EXIT") r.payload_exit = v;
    else if (k == "X_DFLASH_SIGNAL") r.payload_signal = std::atoi(v.c_str());
    else if (k == "STATUS") r.status = v;
    else if (k == "X_DFLASH_READY_S") r.ready_s = std::atof(v.c_str());
    else if (k == "READY") r.ready = r.ready || v == "1";
    else if (k == "WATCHDOG") r.watchdog = r.watchdog || v == "1";
    else if (k == "X_DFLASH_GATE_WARNING") r.gate_warnings.push_back(v);
    else if (k.rfind("X_DFLASH_GATE_", 0) == 0) {
      std::string field = k.substr(std::string("X_DFLASH_GATE_").size());
      for (char& c : field) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      char* end = nullptr;
      double num = std::strtod(v.c_str(), &end);
      if (!r.gate.is_object()) r.gate = nlohmann::json::object();
      r.gate[field] = end && *end == '\0' && !v.empty() ? nlohmann::json(num) : nlohmann::json(v);
    }
  }
  return r;
}

}  // namespace dflash

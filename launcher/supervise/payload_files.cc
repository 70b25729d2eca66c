#include "launcher/supervise/payload_files.h"

#include "common/fd.h"

namespace dflash {

nlohmann::json ReadErrorFile(const std::string& path, std::string* message) {
  std::string text, err;
  if (!ReadFile(path, &text, &err)) return nullptr;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return nlohmann::json{{"unparsed", text.substr(0, 4096)}};
  // torch.distributed.elastic writes {"message": {"message": "...", "extraInfo": {...}}}
  // (or "message" as a plain string in some versions).
  if (message && j.is_object() && j.contains("message")) {
    const auto& m = j["message"];
    if (m.is_string()) *message = m.get<std::string>();
    else if (m.is_object() && m.contains("message") && m["message"].is_string())
      *message = m["message"].get<std::string>();
  }
  return j;
}

nlohmann::json ReadMetricsFile(const std::string& path) {
  std::string text, err;
  if (!ReadFile(path, &text, &err)) return nullptr;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return nullptr;
  return j;
}

int64_t MetricsCounter(const nlohmann::json& metrics, const char* key) {
  if (!metrics.is_object()) return -1;
  auto it = metrics.find(key);
  if (it == metrics.end() || !it->is_number()) return -1;
  return it->get<int64_t>();
}

}  // namespace dflash

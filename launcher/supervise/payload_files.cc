#include "launcher/supervise/payload_files.h"

#include <algorithm>

#include "common/untrusted_file.h"

namespace dflash {
namespace {

/// The file's text, or false (absent, or unreadable with `*unreadable` set).
bool ReadPayloadFile(const std::string& path, const std::string& run_dir, size_t limit, std::string* text,
                     std::string* unreadable) {
  std::string why;
  UntrustedFileRules rules;
  rules.limit = limit;
  rules.beneath = run_dir;
  UntrustedRead r = ReadUntrustedFile(path, rules, text, &why);
  if (unreadable) *unreadable = r == UntrustedRead::kUnreadable ? why : "";
  return r == UntrustedRead::kOk;
}

/// How deep `text`'s arrays and objects nest (brackets inside strings do not count). nlohmann parses any depth
/// but dumps (summary.json) recursively: a payload's "[[[[..." of a few MB would overflow the stack.
int NestingDepth(const std::string& text) {
  int depth = 0, most = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

/// The payload file's JSON, or discarded (not JSON) or null with `*unreadable` set (nested too deep).
nlohmann::json ParsePayloadJson(const std::string& text, std::string* unreadable) {
  if (NestingDepth(text) > kPayloadJsonDepth) {
    if (unreadable) *unreadable = "JSON nested deeper than " + std::to_string(kPayloadJsonDepth) + " levels";
    return nullptr;
  }
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

nlohmann::json ReadErrorFile(const std::string& path, const std::string& run_dir, std::string* message,
                             std::string* unreadable) {
  std::string text;
  if (!ReadPayloadFile(path, run_dir, kErrorFileLimit, &text, unreadable)) return nullptr;
  nlohmann::json j = ParsePayloadJson(text, unreadable);
  if (j.is_null()) return nullptr;
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

nlohmann::json ReadMetricsFile(const std::string& path, const std::string& run_dir, std::string* unreadable) {
  std::string text;
  if (!ReadPayloadFile(path, run_dir, kMetricsFileLimit, &text, unreadable)) return nullptr;
  nlohmann::json j = ParsePayloadJson(text, unreadable);
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

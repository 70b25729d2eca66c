#include "launcher/cluster/store_records.h"

#include <cctype>
#include <charconv>

namespace dflash {
namespace {

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

bool ValidFailureRecord(const nlohmann::json& r, int nnodes, std::string* why) {
  if (!r.is_object()) {
    *why = "not a JSON object";
    return false;
  }
  auto node = r.find("node");
  if (node == r.end() || !node->is_number_integer()) {
    *why = "no integer \"node\"";
    return false;
  }
  long long n = node->get<long long>();
  if (n < 0 || n >= nnodes) {
    *why = "\"node\": " + std::to_string(n) + " is no node of this run (0.." + std::to_string(nnodes - 1) + ")";
    return false;
  }
  auto code = r.find("exit_code");
  if (code != r.end() && !code->is_null()) {
    if (!code->is_number_integer()) {
      *why = "\"exit_code\" is not an integer";
      return false;
    }
    long long c = code->get<long long>();
    if (c == 0 || c < -255 || c > 255) {
      *why = "\"exit_code\": " + std::to_string(c) + " is no failure";
      return false;
    }
  }
  auto proc = r.find("process");
  if (proc != r.end() && !proc->is_null() && !(proc->is_string() && proc->get_ref<const std::string&>().size() <= 256)) {
    *why = "\"process\" is not a short string";
    return false;
  }
  auto reason = r.find("reason");
  if (reason == r.end() || !reason->is_string()) {
    *why = "no string \"reason\"";
    return false;
  }
  auto how = r.find("how");
  if (how != r.end() && !(how->is_string() && (*how == "failed" || *how == "lost" || *how == "replaced" ||
                                               *how == "left behind"))) {
    *why = "\"how\" is none of failed, lost, replaced, left behind";
    return false;
  }
  return true;
}

NodeCulprit FailureCulprit(const nlohmann::json& r) {
  NodeCulprit c;
  c.node = r.value("node", -1);
  std::string how = r.contains("how") && r["how"].is_string() ? r["how"].get<std::string>() : "failed";
  if (how == "lost") {
    c.kind = NodeCulprit::Kind::kNodeLost;
  } else if (how == "replaced") {
    c.kind = NodeCulprit::Kind::kNodeReplaced;
  } else if (how == "left behind") {
    c.kind = NodeCulprit::Kind::kLeftBehind;
  } else {
    c.kind = NodeCulprit::Kind::kNodeFailed;
    auto proc = r.find("process");
    if (proc != r.end() && proc->is_string()) c.process = proc->get<std::string>();
  }
  return c;
}

bool ParseRoundRecord(const std::string& text, int seen, int* round, std::string* why) {
  if (text.empty()) {
    *round = 0;
    return true;
  }
  if (!AllDigits(text)) {
    *why = "the round \"" + text.substr(0, 40) + "\" is not a number";
    return false;
  }
  long long v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  if (v > static_cast<long long>(seen) + 1000) {
    *why = "the round " + text + " is far past this run's (" + std::to_string(seen) + ")";
    return false;
  }
  *round = static_cast<int>(v);
  return true;
}

bool ValidRegistration(const std::string& nonce, const std::string& heartbeat) {
  if (nonce.size() != 32) return false;
  for (char c : nonce)
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  return AllDigits(heartbeat);
}

}  // namespace dflash

#include "launcher/control/control_wire.h"

#include <set>
#include <vector>

#include "common/json_field.h"

namespace dflash {
namespace {

/// Parses `line`, noting in `*duplicate` the first key an object repeats.
/// nlohmann keeps the last of duplicate keys (RFC 8259 leaves it open), so
/// {"verb":"status","verb":"restart"} would read as a restart of everything
/// while a log or a proxy that keeps the first sees a harmless status.
nlohmann::json ParseRefusingDuplicates(const std::string& line, std::string* duplicate) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  auto note = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) keys.pop_back();
    else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate->empty())
      *duplicate = parsed.get<std::string>();
    return true;
  };
  return nlohmann::json::parse(line, note, /*allow_exceptions=*/false);
}

}  // namespace

std::string EncodeRequest(const ControlRequest& r) {
  nlohmann::json j = {{"verb", ControlVerbName(r.verb)}};
  if (VerbTakesTarget(r.verb)) j["target"] = r.target;
  if (r.verb == ControlVerb::kSignal) j["signal"] = r.signal;
  return j.dump() + "\n";
}

bool DecodeRequest(const std::string& line, ControlRequest* out, std::string* err) {
  std::string duplicate;
  nlohmann::json j = ParseRefusingDuplicates(line, &duplicate);
  if (j.is_discarded()) {
    *err = "bad request: not JSON (one JSON object per line, e.g. {\"verb\":\"status\"})";
    return false;
  }
  if (!duplicate.empty()) {
    *err = "bad request: the key \"" + duplicate + "\" appears twice; give each key once";
    return false;
  }
  if (!j.is_object()) {
    *err = "bad request: not a JSON object";
    return false;
  }
  ControlRequest r;
  auto verb = j.find("verb");
  if (verb == j.end() || !verb->is_string()) {
    *err = "bad request: no \"verb\" string";
    return false;
  }
  if (!ParseControlVerb(verb->get<std::string>(), &r.verb)) {
    *err = "bad request: unknown verb \"" + verb->get<std::string>() +
           "\"; verbs: status, restart, stop, start, signal, metrics";
    return false;
  }
  if (VerbTakesTarget(r.verb)) {
    auto target = j.find("target");
    if (target == j.end() || !target->is_string() || target->get<std::string>().empty()) {
      *err = std::string("bad request: ") + ControlVerbName(r.verb) + " needs a \"target\" (role, role:rank or all)";
      return false;
    }
    r.target = target->get<std::string>();
  }
  if (r.verb == ControlVerb::kSignal) {
    auto sig = j.find("signal");
    if (sig == j.end() || !sig->is_number_integer() || sig->get<int64_t>() < 1 || sig->get<int64_t>() > 64) {
      *err = "bad request: signal needs a \"signal\" number 1..64";
      return false;
    }
    r.signal = sig->get<int>();
  }
  *out = std::move(r);
  return true;
}

std::string EncodeReply(const ControlReply& r) {
  nlohmann::json j = {{"ok", r.ok}};
  if (r.ok) j["body"] = r.body;
  else j["error"] = r.error;
  // Process names and STATUS= texts are the payloads' bytes: never let one
  // invalid UTF-8 sequence make the whole reply unencodable.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

bool DecodeReply(const std::string& line, ControlReply* out, std::string* err) {
  std::string duplicate;
  nlohmann::json j = ParseRefusingDuplicates(line, &duplicate);
  if (!duplicate.empty()) {
    *err = "the run's reply repeats the key \"" + duplicate + "\"";
    return false;
  }
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean()) {
    *err = "the run's reply is not a control reply";
    return false;
  }
  ControlReply r;
  r.ok = j["ok"].get<bool>();
  if (r.ok) r.body = j.value("body", nlohmann::json());
  else r.error = JsonText(j, "error", "refused");
  *out = std::move(r);
  return true;
}

}  // namespace dflash

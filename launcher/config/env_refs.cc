#include "launcher/config/env_refs.h"

#include <cctype>

namespace dflash {

bool ExpandEnvRefs(const std::string& in, const EnvLookup& lookup, std::string* out, std::string* name,
                   std::string* why) {
  out->clear();
  for (size_t i = 0; i < in.size();) {
    if (in.compare(i, 3, "$${") == 0) {  // the escape: a literal ${
      *out += "${";
      i += 3;
      continue;
    }
    if (in.compare(i, 2, "${") != 0) {
      *out += in[i++];
      continue;
    }
    size_t end = in.find('}', i + 2);
    if (end == std::string::npos) {
      *name = in.substr(i + 2);
      *why = "an unfinished ${ (no closing })";
      return false;
    }
    *name = in.substr(i + 2, end - i - 2);
    bool valid = !name->empty() && !std::isdigit(static_cast<unsigned char>((*name)[0]));
    for (char c : *name) valid &= std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    if (!valid) {
      *why = "not a variable name ([A-Za-z_][A-Za-z0-9_]*)";
      return false;
    }
    const char* value = lookup(*name);
    if (!value || !*value) {
      *why = value ? "empty" : "unset";
      return false;
    }
    *out += value;
    i = end + 1;
  }
  return true;
}

}  // namespace dflash

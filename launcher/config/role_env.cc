// A [[role]]'s env table, and `${NAME}` in its command and warmup from the launcher's own environment.
#include <cstdlib>

#include "common/redact.h"
#include "launcher/config/config_internal.h"
#include "launcher/config/env_refs.h"

namespace dflash {

/// `${NAME}` in each argument of `argv` (read from `node`, an array of strings) from dflash-launch's own
/// environment (env_refs.h); what cannot be expanded is an error at that argument.
void ExpandRefs(TableReader& r, const toml::node* node, const char* key, std::vector<std::string>* argv) {
  if (!node || !node->is_array()) return;
  const toml::array& a = *node->as_array();
  for (size_t i = 0; i < argv->size() && i < a.size(); ++i) {
    std::string out, name, why;
    if (ExpandEnvRefs((*argv)[i], [](const std::string& n) { return std::getenv(n.c_str()); }, &out, &name, &why)) {
      (*argv)[i] = std::move(out);
      continue;
    }
    bool var = why == "unset" || why == "empty";
    r.Error(std::string(key) + "[" + std::to_string(i) + "]", PosOf(a[i].source()),
            var ? "${" + name + "} is " + why + " in dflash-launch's environment" : "a ${...} that is " + why,
            var ? name + " set to a value: ${NAME} in a command is the launcher's environment variable NAME"
                : "${NAME}, NAME of letters, digits and '_', closed by }",
            var ? name + " " + why : "\"" + (*argv)[i] + "\"",
            var ? "export " + name + "=... before dflash-launch (docs/config.md, \"Values from the launcher's "
                  "environment\")"
                : "write $${ for a literal ${");
  }
}

void ReadEnv(TableReader& r, RoleSpec* role) {
  const toml::node* n = r.Get("env");
  if (!n) return;
  if (!n->is_table()) {
    r.TypeError("env", *n);
    return;
  }
  for (auto&& [k, v] : *n->as_table()) {
    std::string name(k.str());
    if (!ValidEnvName(name)) {
      r.Error("env", PosOf(k.source()), "not a valid environment variable name", "[A-Za-z_][A-Za-z0-9_]*",
              "`" + name + "`", "use letters, digits and '_', not starting with a digit");
      continue;
    }
    if (IsReservedEnv(name)) {
      r.Error("env", PosOf(k.source()), name + " is set by dflash-launch for each process",
              "a variable dflash-launch does not manage", "`" + name + "`", ReservedEnvHint(name));
      continue;
    }
    // A secret's value is not echoed, not even a mistyped one (common/redact.h).
    const bool secret = IsSecretEnvName(name);
    if (!v.is_string()) {
      r.Error("env", PosOf(v.source()), "environment values are strings", "a string",
              secret ? std::string(v.is_integer() ? "an integer" : "not a string") : DescribeNode(v),
              v.is_integer() && !secret ? "quote it: " + name + " = \"" + std::to_string(v.as_integer()->get()) + "\""
                                        : "quote it: " + name + " = \"...\"");
      continue;
    }
    std::string value(v.as_string()->get());
    if (size_t nul = value.find('\0'); nul != std::string::npos) {
      // execve takes C strings: the value would be cut at the NUL, silently.
      r.Error("env", PosOf(v.source()), "environment values cannot hold a NUL character (\\u0000)",
              "a string without NUL", "a NUL at offset " + std::to_string(nul) + " of " + name + "'s value",
              secret ? std::string("remove the \\u0000: the process would see only its first ") +
                           std::to_string(nul) + " bytes"
                     : "remove the \\u0000: the process would see only \"" +
                           RedactEnvValue(name, value.substr(0, nul)) + "\"");
      continue;
    }
    role->env.emplace_back(name, std::move(value));
    role->env_pos.push_back(PosOf(v.source()));
  }
}

}  // namespace dflash

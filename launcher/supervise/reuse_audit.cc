#include "launcher/supervise/reuse_audit.h"

namespace dflash {

std::string ReuseMissWarning(const std::string& name, const std::string& key, int64_t misses,
                             const std::vector<KeyFile>& key_files,
                             const std::function<std::string(const std::string&)>& sha256_now) {
  if (misses <= 0) return "";
  std::string changed;
  size_t imports = 0;
  std::string script;
  for (const KeyFile& f : key_files) {
    if (f.why.rfind("import ", 0) == 0) ++imports;
    else if (script.empty() && (f.why.rfind("script ", 0) == 0 || f.why.rfind("module ", 0) == 0)) script = f.path;
    if (!f.path.empty() && sha256_now(f.path) != f.sha256) changed += (changed.empty() ? "" : ", ") + f.path;
  }
  std::string covers = script.empty() ? "" : "; the key covers " + script + " and " + std::to_string(imports) +
                                                 " module(s) it imports (dflash-launch check lists them)";
  return name + " reused gate " + key + " but missed the FX graph cache " + std::to_string(misses) + " time(s): " +
         (changed.empty() ? "" : "edited since the run was planned: " + changed + "; else ") +
         "the gate key does not cover something Inductor's cache key sees: code the key cannot see (a "
         "module loaded by importlib or exec, a file the model reads: add it to gate.key_files), a "
         "TORCHINDUCTOR_* setting, another torch, other shapes" + covers + "; it compiled on its own";
}

}  // namespace dflash

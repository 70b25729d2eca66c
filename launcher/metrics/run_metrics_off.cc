// RunMetrics in a build without prometheus-cpp (the wheel's portable build, cmake/portable.cmake): nothing is
// served, and Serve says why, so a run warns once instead of pretending to export.
#include "launcher/metrics/run_metrics.h"

namespace prometheus {
class Registry {};
class Exposer {};
}  // namespace prometheus

namespace dflash {

struct RunMetrics::Families {};
struct RunMetrics::ProcessSeries {};

bool RunMetrics::Available() { return false; }

RunMetrics::RunMetrics() = default;
RunMetrics::~RunMetrics() = default;

bool RunMetrics::Serve(const std::string&, std::string* err) {
  *err = "this dflash-launch was built without prometheus-cpp (the wheel's portable build): no metrics are "
         "served; docs/metrics.md";
  return false;
}

std::string RunMetrics::Text() const { return ""; }

void RunMetrics::Update(const RunSnapshot&) {}

}  // namespace dflash

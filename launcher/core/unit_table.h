// What the core's policies (ctl's verbs, store-mode rounds) may ask of it: its units, and the few moves that
// touch more than one unit or the run. SupervisorCore is the one implementation; a policy holds a UnitTable&
// and nothing else of the core.
#pragma once

#include <string>
#include <vector>

#include "launcher/core/process_unit.h"

namespace dflash {

class UnitTable {
 public:
  virtual std::vector<ProcessUnit>& units() = 0;
  virtual bool stopping() const = 0;
  virtual const std::string& stop_reason() const = 0;
  virtual SteadyTime Now() const = 0;
  virtual double Since(SteadyTime t) const = 0;
  virtual void Emit(CoreAction a) = 0;
  /// Starts unit `i`, or holds it in WAITING with the reason (`prefix` before it).
  virtual void StartOrHold(size_t i, const std::string& prefix) = 0;
  /// The units restarted together with `i` (its restart scope, widened to its torch world).
  virtual std::vector<size_t> RestartUnit(size_t i) const = 0;
  /// The units of `i`'s torch world, `i` included (`i` alone outside one).
  virtual std::vector<size_t> TorchWorldOf(size_t i) const = 0;
  /// `ctl stop all`: the run ends, by hand, for `reason`.
  virtual void StopByHand(const std::string& reason) = 0;

 protected:
  ~UnitTable() = default;
};

}  // namespace dflash

// Integer tuning knobs from the environment, for sweeps on the GPU machine (0 when unset). Plain C++.
#pragma once
#include <cstdlib>

namespace ltxbench {

// Read once per call site: `static const int v = tuning_knob("LTXBENCH_...");`.
inline int tuning_knob(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : 0;
}

// A knob set to 0 turns a default-on path off; unset leaves it on.
inline bool tuning_off(const char* name) { return std::getenv(name) && tuning_knob(name) == 0; }

}  // namespace ltxbench

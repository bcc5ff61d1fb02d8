// Integer tuning knobs from the environment, for sweeps on the GPU machine (0 when unset). Plain C++.
#pragma once
#include <cstdlib>

namespace ltxbench {

// Read once per call site: `static const int v = tuning_knob("LTXBENCH_...");`.
inline int tuning_knob(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : 0;
}

}  // namespace ltxbench

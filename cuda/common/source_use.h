// Which kernel and binding files a process entered. Every function that another file calls (the launchers declared
// in params.h and row_math.cuh) and every op entry a binding file registers starts with NOTE_SOURCE_USED(), once per
// call site and process; a result then names those files as the code it measured, so a later change to a kernel or
// an op it never ran leaves it current (ltxbench/results/provenance.py). Plain C++.
#pragma once

namespace ltxbench {
void note_source_used(const char* file);  // bindings/source_use.cpp
}  // namespace ltxbench

#define NOTE_SOURCE_USED()                                                              \
  do {                                                                                  \
    static const bool ltxbench_noted_ = (::ltxbench::note_source_used(__FILE__), true); \
    (void)ltxbench_noted_;                                                              \
  } while (0)

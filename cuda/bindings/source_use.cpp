// The kernel and binding files this process entered (common/source_use.h), for a result's provenance: read from
// Python through the C entry below (ctypes: a list of names, not an op on tensors).
#include "common/source_use.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace ltxbench {
namespace {

std::mutex& used_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::set<std::string>& used_files() {
  static std::set<std::string> files;
  return files;
}

}  // namespace

void note_source_used(const char* file) {
  // A kernel file by its name (norm.cu), a binding file with its folder (bindings/norm.cpp): names under cuda/.
  const std::string path(file), folder = "/bindings/";
  const size_t slash = path.rfind('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (slash != std::string::npos && slash + 1 >= folder.size() &&
      path.compare(slash + 1 - folder.size(), folder.size(), folder) == 0)
    name = "bindings/" + name;
  const std::lock_guard<std::mutex> lock(used_mutex());
  used_files().insert(name);
}

}  // namespace ltxbench

// The file names (no folder), one per line, into out[capacity] (NUL-terminated, cut at capacity - 1); returns the
// length of the whole list, so a caller whose buffer was short asks again with a larger one.
extern "C" int ltxbench_sources_used(char* out, int capacity) {
  std::string text;
  {
    const std::lock_guard<std::mutex> lock(ltxbench::used_mutex());
    for (const auto& name : ltxbench::used_files()) text += name + "\n";
  }
  if (out != nullptr && capacity > 0) {
    const size_t n = std::min(text.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return static_cast<int>(text.size());
}

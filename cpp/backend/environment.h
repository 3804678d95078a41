// How the process group reads its environment variables (their names,
// defaults and meanings: python/torch_mojo/env.py).
//
// No torch headers here.
#pragma once

#include <cstdlib>
#include <string>

namespace torch_mojo {

// The value of `name`, else of `alternative` (PyTorch's older name for the
// same), where set and not empty; else `fallback`.
inline std::string environment(const char* name, const char* alternative = nullptr, const std::string& fallback = "") {
  for (const char* key : {name, alternative}) {
    const char* value = key != nullptr ? std::getenv(key) : nullptr;
    if (value != nullptr && value[0] != '\0') return value;
  }
  return fallback;
}

}  // namespace torch_mojo

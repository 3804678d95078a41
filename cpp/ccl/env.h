// Reading MOJOCCL_* variables. A bad value is an ncclInvalidArgument that
// names the variable and what it accepts; it never silently falls back.
// The table of variables, their defaults and meanings lives in
// python/torch_mojo/env.py, from which the docs and checks follow.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mojoccl {

// Integer in [min, max]; `fallback` when unset or empty.
int64_t envInt(const char* name, int64_t fallback, int64_t min, int64_t max);

// One of `choices`; `fallback` when unset or empty.
std::string envChoice(const char* name, const std::string& fallback,
                      const std::vector<std::string>& choices);

// Free text; `fallback` when unset.
std::string envString(const char* name, const std::string& fallback = "");

// The comma-separated items of a list-valued setting, in order ("" -> none).
std::vector<std::string> commaSeparated(const std::string& text);

}  // namespace mojoccl

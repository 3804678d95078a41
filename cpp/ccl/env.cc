#include "env.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "error.h"

namespace mojoccl {

static const char* envValue(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

int64_t envInt(const char* name, int64_t fallback, int64_t min, int64_t max) {
  const char* text = envValue(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
    fail(ncclInvalidArgument, std::string(name) + "=" + text +
                                  " is not valid: expected an integer from " +
                                  std::to_string(min) + " to " + std::to_string(max));
  }
  return value;
}

std::string envChoice(const char* name, const std::string& fallback,
                      const std::vector<std::string>& choices) {
  const char* text = envValue(name);
  if (text == nullptr) return fallback;
  std::string allowed;
  for (const auto& choice : choices) {
    if (choice == text) return choice;
    allowed += (allowed.empty() ? "" : ", ") + choice;
  }
  fail(ncclInvalidArgument,
       std::string(name) + "=" + text + " is not valid: expected one of " + allowed);
}

std::string envString(const char* name, const std::string& fallback) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::string(text) : fallback;
}

std::vector<std::string> commaSeparated(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) items.push_back(item);
  return items;
}

}  // namespace mojoccl

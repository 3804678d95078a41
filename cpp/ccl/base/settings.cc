#include "base/settings.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "mojoccl/nccl.h"

namespace mojoccl {
namespace {
#define MOJOCCL_TEXT_OF(number) #number
#define MOJOCCL_TEXT(number) MOJOCCL_TEXT_OF(number)
constexpr const char* kBootstrapTimeoutDefault = MOJOCCL_TEXT(MOJOCCL_BOOTSTRAP_TIMEOUT_S_DEFAULT);
}  // namespace

const std::vector<Setting>& settings() {
  using K = SettingKind;
  static const std::vector<Setting> table = {
      {"MOJOCCL_SOCKET_IFNAME", K::Text, "", 0, 0, ""},
      {"MOJOCCL_BOOTSTRAP_TIMEOUT_S", K::Integer, kBootstrapTimeoutDefault, 1, 86400, ""},
      {"MOJOCCL_JOB_KEY", K::Text, "", 0, 0, ""},
      {"MOJOCCL_JOB_KEY_FILE", K::Text, "", 0, 0, ""},
      {"MOJOCCL_HOSTID", K::Text, "", 0, 0, ""},
      {"MOJOCCL_ALGO", K::Choice, "auto", 0, 0, "auto,one_shot,two_shot"},
      {"MOJOCCL_NET_ALGO", K::Text, "auto", 0, 0, ""},  // a list: algorithms/network_choice.cc reads it
      {"MOJOCCL_NET_DIRECT_NODES", K::Integer, "16", 1, 1 << 20, ""},
      {"MOJOCCL_NET_FRAMES", K::Choice, "auto", 0, 0, "auto,socket,fabric"},
      {"MOJOCCL_NET_RAILS", K::Choice, "1", 0, 0, "0,1"},
      {"MOJOCCL_ZERO_COPY", K::Choice, "1", 0, 0, "0,1"},
      {"MOJOCCL_DEVICE_PEERS", K::Choice, "0", 0, 0, "0,1"},
      {"MOJOCCL_DETERMINISTIC", K::Choice, "0", 0, 0, "0,1"},
      {"MOJOCCL_IB_TIMEOUT_S", K::Integer, "60", 1, 86400, ""},
      {"MOJOCCL_NET", K::Choice, "fabric", 0, 0, "verbs,fabric"},
      {"MOJOCCL_FABRIC_DOMAIN", K::Text, "", 0, 0, ""},
      {"MOJOCCL_FABRIC_PROVIDER", K::Text, "auto", 0, 0, ""},  // a provider's name, or a list
      {"MOJOCCL_LIBFABRIC", K::Text, "", 0, 0, ""},
      {"MOJOCCL_REGION_MB", K::Integer, "256", 0, 65536, ""},
      {"MOJOCCL_FABRIC_MR_LOCAL", K::Choice, "0", 0, 0, "0,1"},
      {"MOJOCCL_FABRIC_DIRECTED_RECV", K::Choice, "1", 0, 0, "0,1"},
      {"MOJOCCL_IB_TRACE", K::Choice, "0", 0, 0, "0,1"},
  };
  return table;
}

namespace {

const Setting& lookUp(const char* name, SettingKind kind) {
  for (const Setting& setting : settings())
    if (std::strcmp(setting.name, name) == 0 && setting.kind == kind) return setting;
  fail(ncclInternalError, std::string("libmojoccl reads ") + name + ", which its table of settings lacks");
}

// The variable's value; nullptr when unset or empty.
const char* valueOf(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

std::string accepted(const Setting& setting) {
  switch (setting.kind) {
    case SettingKind::Integer:
      return "an integer from " + std::to_string(setting.min) + " to " + std::to_string(setting.max);
    case SettingKind::Choice: {
      std::string choices;
      for (const std::string& choice : commaSeparated(setting.choices))
        choices += (choices.empty() ? "" : ", ") + choice;
      return "one of " + choices;
    }
    case SettingKind::Text:
      break;
  }
  return "any text";
}

}  // namespace

int64_t settingInt(const char* name) {
  const Setting& setting = lookUp(name, SettingKind::Integer);
  const char* text = valueOf(name);
  if (text == nullptr) return std::strtoll(setting.fallback, nullptr, 10);
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < setting.min || value > setting.max)
    fail(ncclInvalidArgument, std::string(name) + "=" + text + " is not valid: expected " + accepted(setting));
  return value;
}

std::string settingChoice(const char* name) {
  const Setting& setting = lookUp(name, SettingKind::Choice);
  const char* text = valueOf(name);
  if (text == nullptr) return setting.fallback;
  for (const std::string& choice : commaSeparated(setting.choices))
    if (choice == text) return choice;
  fail(ncclInvalidArgument, std::string(name) + "=" + text + " is not valid: expected " + accepted(setting));
}

bool settingOn(const char* name) { return settingChoice(name) == "1"; }

std::string settingText(const char* name) {
  const Setting& setting = lookUp(name, SettingKind::Text);
  const char* text = valueOf(name);
  return text != nullptr ? text : setting.fallback;
}

std::string describeSettings() {
  std::string lines;
  for (const Setting& setting : settings()) {
    const char* kind = setting.kind == SettingKind::Integer ? "integer"
                       : setting.kind == SettingKind::Choice ? "choice"
                                                              : "text";
    lines += std::string(setting.name) + "\t" + kind + "\t" + setting.fallback + "\t" + accepted(setting) + "\n";
  }
  return lines;
}

std::vector<std::string> commaSeparated(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) items.push_back(item);
  return items;
}

}  // namespace mojoccl

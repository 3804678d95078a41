// Every MOJOCCL_* variable libmojoccl reads, in one table (settings.cc):
// its name, its default, and what it accepts, read through one accessor per
// kind. A bad value is an ncclInvalidArgument that names the variable and
// what it accepts; it never silently falls back. python/torch_mojo/env.py
// says what each one does, for the docs, the doctor and `torch-mojo info`;
// mojocclSettings() lists this table, and tests/test_python_api.py holds
// the two together.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mojoccl {

enum class SettingKind { Integer, Choice, Text };

struct Setting {
  const char* name;
  SettingKind kind;
  const char* fallback;  // when unset or empty; Text: "" where the reader decides
  int64_t min, max;      // Integer
  const char* choices;   // Choice: comma-separated
};

// The table, in the order env.py lists the same names.
const std::vector<Setting>& settings();

// The value of the named setting (which must be in the table, of that kind).
int64_t settingInt(const char* name);
std::string settingChoice(const char* name);
bool settingOn(const char* name);  // a choice of "0" and "1"
std::string settingText(const char* name);

// One line per setting: "name<TAB>kind<TAB>default<TAB>accepts", what
// mojocclSettings() returns.
std::string describeSettings();

// The comma-separated items of a list-valued setting, in order ("" -> none).
std::vector<std::string> commaSeparated(const std::string& text);

}  // namespace mojoccl

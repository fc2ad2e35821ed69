// What settings.cc and settings_table.cc share (not part of the public settings.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fl/server/settings.h"

namespace fl::server::settings_internal {

inline constexpr double kU64 = 18446744073709551615.0;  // the largest uint64_t (a double rounds it to 2^64)

// Shortest text that reads back as the same double ("0.05", "1e+08").
std::string NumberText(double v);
// Canonical text (checked by CheckSettingValue) to a number.
uint64_t ToU64(const std::string& text);
double ToDouble(const std::string& text);

// Every setting, declared (settings_table.cc).
std::vector<Setting> MakeSettingsTable();

}  // namespace fl::server::settings_internal

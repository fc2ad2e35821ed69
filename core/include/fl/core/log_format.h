// Lets spdlog/fmt print absl::string_view (what absl::Status::message() returns).
//
// Debian's Abseil keeps absl::string_view a type of its own (see str_cat.h), which fmt does not know.
// Header-only: core itself does not log; the binaries that link spdlog include this.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include "absl/strings/string_view.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.data(), s.size()), ctx);
  }
};

// fl::StrCat: absl::StrCat that also takes std::string_view.
//
// Debian 12 builds Abseil with ABSL_OPTION_USE_STD_STRING_VIEW=0, so absl::string_view is its own type and
// absl::StrCat does not accept std::string_view. Our interfaces use std::string_view; this adapter keeps
// call sites clean instead of converting at every one.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fl {
namespace str_cat_internal {
inline absl::string_view Adapt(std::string_view s) { return absl::string_view(s.data(), s.size()); }
template <typename T>
const T& Adapt(const T& value) {
  return value;
}
}  // namespace str_cat_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(str_cat_internal::Adapt(args)...);
}

// absl::string_view -> std::string_view (e.g. for absl::Status::message()).
inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace fl

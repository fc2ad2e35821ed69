// Names that become parts of paths: an experiment's name is its output folder (out/<name>), a client group's name
// its clients' log files and certificates (<out>/<name>-<i>.log), a profile's name the file it is read from.
// `name: ../../..` in a manifest must not put a run's records, logs or throwaway CA anywhere else, so such a name
// is a single path component of a restricted alphabet.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace fl::config {

// Long enough for any descriptive name, short enough that <name>-<index>.log stays far below NAME_MAX (255).
inline constexpr size_t kMaxSafeNameLength = 128;

// What a safe name is, for "allowed: ..." in errors.
inline constexpr char kSafeNameAllowed[] =
    "1 to 128 letters, digits, '.', '_' and '-', not starting with '.' or '-' (it names a folder or file)";

// Why `name` is not a safe name (nullopt when it is): empty, too long, a character outside [A-Za-z0-9._-]
// (a '/' included), or starting with '.' ("..", hidden files) or '-' (read as an option by tools).
inline std::optional<std::string> WhyNotASafeName(std::string_view name) {
  if (name.empty()) return std::string("is empty");
  if (name.size() > kMaxSafeNameLength) {
    return "is " + std::to_string(name.size()) + " characters long, over " + std::to_string(kMaxSafeNameLength);
  }
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      if (c == '/') return std::string("has a '/' (a name is one folder or file name, not a path)");
      const unsigned char u = static_cast<unsigned char>(c);
      if (u < 0x20 || u >= 0x7f) return "has the byte " + std::to_string(u) + ", not a letter, digit, '.', '_' or '-'";
      return std::string("has the character '") + c + "'";
    }
  }
  if (name.front() == '.') return std::string("starts with '.' ('..' would leave the output folder)");
  if (name.front() == '-') return std::string("starts with '-'");
  return std::nullopt;
}

}  // namespace fl::config

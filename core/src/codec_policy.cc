// Link-aware compression: parsing --uplink-codec-policy and choosing a client's uplink codec (codec_policy.h).
#include "fl/core/codec_policy.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

constexpr std::string_view kAccepted =
    "accepted: 'fixed' (every client gets --uplink-codec), "
    "'by-link:KIND=CODEC,...,default=CODEC' with KIND one of 5g, wifi, ethernet, other, unknown (e.g. "
    "by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32), or "
    "'by-rate:BYTES_PER_S=CODEC,...,default=CODEC' (e.g. by-rate:0=int4,2e6=int8,2e7=fp32,default=fp32); "
    "CODEC is a codec spec such as fp32, fp16, bf16, int8, int4, fp4, sign1, int8:256";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(Trim(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start)));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

}  // namespace

std::vector<std::string> CodecPolicy::Codecs() const {
  std::set<std::string> all{default_codec};
  for (const auto& [kind, codec] : by_link) all.insert(codec);
  for (const auto& [rate, codec] : by_rate) all.insert(codec);
  return {all.begin(), all.end()};
}

std::string CodecPolicy::ToString() const {
  std::string out;
  switch (basis) {
    case Basis::kFixed: return fl::StrCat("fixed (", default_codec, ")");
    case Basis::kByLink:
      out = "by-link:";
      for (const auto& [kind, codec] : by_link) out += fl::StrCat(kind, "=", codec, ",");
      break;
    case Basis::kByRate:
      out = "by-rate:";
      for (const auto& [rate, codec] : by_rate) {
        char text[32];
        std::snprintf(text, sizeof(text), "%.15g", rate);  // 2000000, not StrCat's 2e+06
        out += fl::StrCat(text, "=", codec, ",");
      }
      break;
  }
  return fl::StrCat(out, "default=", default_codec);
}

absl::StatusOr<CodecPolicy> ParseCodecPolicy(std::string_view spec, std::string_view fallback_codec) {
  auto bad = [&](std::string_view problem) {
    return absl::InvalidArgumentError(fl::StrCat("--uplink-codec-policy '", spec, "': ", problem, "; ", kAccepted));
  };
  CodecPolicy policy;
  policy.default_codec = std::string(fallback_codec);
  spec = Trim(spec);
  if (spec.empty() || spec == "fixed") return policy;
  const size_t colon = spec.find(':');
  const std::string_view basis = spec.substr(0, colon);
  if (basis == "by-link") {
    policy.basis = CodecPolicy::Basis::kByLink;
  } else if (basis == "by-rate") {
    policy.basis = CodecPolicy::Basis::kByRate;
  } else {
    return bad(fl::StrCat("unknown policy '", basis, "'"));
  }
  if (colon == std::string_view::npos || Trim(spec.substr(colon + 1)).empty()) {
    return bad(fl::StrCat("'", basis, "' needs at least one KEY=CODEC after the colon"));
  }
  std::set<std::string, std::less<>> seen;
  for (std::string_view entry : Split(spec.substr(colon + 1), ',')) {
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) return bad(fl::StrCat("entry '", entry, "' is not KEY=CODEC"));
    const std::string_view key = Trim(entry.substr(0, eq));
    const std::string_view codec = Trim(entry.substr(eq + 1));
    if (auto c = MakeCodec(codec); !c.ok()) {
      return bad(fl::StrCat("entry '", entry, "': ", fl::ToStd(c.status().message())));
    }
    if (!seen.insert(std::string(key)).second) return bad(fl::StrCat("'", key, "' is given twice"));
    if (key == "default") {
      policy.default_codec = std::string(codec);
      continue;
    }
    if (policy.basis == CodecPolicy::Basis::kByLink) {
      if (std::find(std::begin(kPolicyLinkKinds), std::end(kPolicyLinkKinds), key) == std::end(kPolicyLinkKinds)) {
        return bad(fl::StrCat("unknown link kind '", key, "'"));
      }
      policy.by_link.emplace(std::string(key), std::string(codec));
    } else {
      double rate = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), rate);
      if (ec != std::errc() || end != key.data() + key.size() || !std::isfinite(rate) || rate < 0) {
        return bad(fl::StrCat("rate '", key, "' is not a number of bytes per second >= 0"));
      }
      policy.by_rate.emplace_back(rate, std::string(codec));
    }
  }
  if (policy.by_link.empty() && policy.by_rate.empty()) {
    return bad(fl::StrCat("'", basis, "' names only a default; use --uplink-codec for one codec for everyone"));
  }
  std::sort(policy.by_rate.begin(), policy.by_rate.end());
  return policy;
}

const std::string& ChooseUplinkCodec(const CodecPolicy& policy, std::string_view link_kind,
                                     std::optional<double> uplink_bytes_per_s) {
  switch (policy.basis) {
    case CodecPolicy::Basis::kFixed: break;
    case CodecPolicy::Basis::kByLink:
      if (auto it = policy.by_link.find(link_kind); it != policy.by_link.end()) return it->second;
      break;
    case CodecPolicy::Basis::kByRate: {
      if (!uplink_bytes_per_s.has_value()) break;
      const std::string* chosen = nullptr;
      for (const auto& [threshold, codec] : policy.by_rate) {
        if (*uplink_bytes_per_s >= threshold) chosen = &codec;
      }
      if (chosen != nullptr) return *chosen;
      break;
    }
  }
  return policy.default_codec;
}

}  // namespace fl::core

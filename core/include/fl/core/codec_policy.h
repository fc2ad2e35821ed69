// Link-aware compression: which uplink codec each client's train task names (fl-server --uplink-codec-policy,
// docs/stragglers.md "Link-aware compression").
//
//   (empty) or "fixed"                        every client gets --uplink-codec
//   by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32
//                                             by the link kind the client declared at Join (JoinRequest.link.kind
//                                             by its proto::LinkKindName: 5g, wifi, ethernet, other, unknown); a
//                                             kind not named gets default
//   by-rate:0=int4,2e6=int8,2e7=fp32,default=fp32
//                                             by the uplink rate the server measured from the client's last
//                                             upload (payload bytes / server-side upload time, bytes per second):
//                                             the codec of the largest threshold at or below that rate; a client
//                                             with no upload yet, or a rate below every threshold, gets default
//
// Codecs are core::MakeCodec specs ("int4", "int8:256", "fp16", ...). `default` may be left out: it is then the
// server's --uplink-codec. Pure functions, no engine state: fl-server's engine calls ChooseUplinkCodec at dispatch,
// fl-experiment checks a manifest's server.uplink_codec_policy with ParseCodecPolicy before it starts anything.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::core {

struct CodecPolicy {
  enum class Basis { kFixed, kByLink, kByRate };
  Basis basis = Basis::kFixed;
  std::map<std::string, std::string, std::less<>> by_link;  // link kind name (proto::LinkKindName) -> codec
  std::vector<std::pair<double, std::string>> by_rate;      // (bytes per second threshold, codec), ascending
  std::string default_codec = "fp32";

  // Every codec the policy can name, default included (the engine makes one decoder of each up front).
  std::vector<std::string> Codecs() const;
  // The policy written back in its canonical form (for logs and the experiment's config record).
  std::string ToString() const;
};

// Parses an --uplink-codec-policy value; `fallback_codec` (the server's --uplink-codec) is the default where the
// spec names none. Errors name the value, the part that is wrong, and what is accepted.
absl::StatusOr<CodecPolicy> ParseCodecPolicy(std::string_view spec, std::string_view fallback_codec);

// The codec a client's next train task names: by its declared link kind, or by its measured uplink rate
// (nullopt: not measured yet).
const std::string& ChooseUplinkCodec(const CodecPolicy& policy, std::string_view link_kind,
                                     std::optional<double> uplink_bytes_per_s);

// The link kinds a by-link policy may name.
inline constexpr std::string_view kPolicyLinkKinds[] = {"5g", "wifi", "ethernet", "other", "unknown"};

}  // namespace fl::core

// Conversions between the fl.v1 wire types and fl::core types, and the error conventions of the protocol.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"
#include "fl/v1/common.pb.h"

namespace fl::proto {

// Bytes per data chunk on DownloadModel and UploadUpdate unless a peer asks for less: large enough that
// per-message overhead is negligible, far below gRPC's 4 MiB default receive limit.
inline constexpr uint32_t kDefaultChunkBytes = 1u << 20;
// The largest chunk either side accepts; messages are capped a little above it for headers.
inline constexpr uint32_t kMaxChunkBytes = 4u << 20;
inline constexpr int kMaxMessageBytes = static_cast<int>(kMaxChunkBytes + (64u << 10));

// The channel arguments of every long-lived client of our services (fl-client's federation session, an
// island's coordinator session): message limits that fit a chunk, keepalive every 20 s (answered within
// 10 s, also without calls in flight) so that a dead peer is noticed while a stream idles.
grpc::ChannelArguments SessionChannelArguments();

fl::v1::DType ToProto(core::DType dtype);
absl::StatusOr<core::DType> FromProto(fl::v1::DType dtype);

fl::v1::ModelSpec ToProto(const core::ModelSpec& spec, std::string_view model_name);
// Rebuilds the spec and checks that the fingerprint it carries equals the recomputed one, so a spec damaged
// or produced by an incompatible build is caught at the edge.
absl::StatusOr<core::ModelSpec> FromProto(const fl::v1::ModelSpec& spec);

std::string_view PhaseName(fl::v1::Phase phase);       // "downlink", "train", ...
std::string_view LinkKindName(fl::v1::LinkKind kind);  // "ethernet", "wifi", "5g", "other", "unknown"
absl::StatusOr<fl::v1::LinkKind> ParseLinkKind(std::string_view name);

fl::v1::ErrorDetail MakeError(fl::v1::ErrorCode code, std::string message, std::string field = "",
                              std::string hint = "");
// A gRPC status whose message is the detail's message (and hint) and whose binary details carry the
// serialized ErrorDetail, so both plain gRPC tools and our client see the reason.
grpc::Status ToGrpcStatus(grpc::StatusCode code, const fl::v1::ErrorDetail& detail);
// The ErrorDetail carried by a failed status, or one built from its code and message.
fl::v1::ErrorDetail ErrorFromGrpcStatus(const grpc::Status& status);

}  // namespace fl::proto

#include "fl/proto/convert.h"

#include <grpc/grpc.h>

#include "fl/core/str_cat.h"

namespace fl::proto {

fl::v1::DType ToProto(core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32: return fl::v1::DTYPE_FLOAT32;
    case core::DType::kFloat16: return fl::v1::DTYPE_FLOAT16;
    case core::DType::kBFloat16: return fl::v1::DTYPE_BFLOAT16;
    case core::DType::kFloat64: return fl::v1::DTYPE_FLOAT64;
    case core::DType::kInt64: return fl::v1::DTYPE_INT64;
    case core::DType::kInt32: return fl::v1::DTYPE_INT32;
    case core::DType::kUInt8: return fl::v1::DTYPE_UINT8;
  }
  return fl::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<core::DType> FromProto(fl::v1::DType dtype) {
  switch (dtype) {
    case fl::v1::DTYPE_FLOAT32: return core::DType::kFloat32;
    case fl::v1::DTYPE_FLOAT16: return core::DType::kFloat16;
    case fl::v1::DTYPE_BFLOAT16: return core::DType::kBFloat16;
    case fl::v1::DTYPE_FLOAT64: return core::DType::kFloat64;
    case fl::v1::DTYPE_INT64: return core::DType::kInt64;
    case fl::v1::DTYPE_INT32: return core::DType::kInt32;
    case fl::v1::DTYPE_UINT8: return core::DType::kUInt8;
    default: break;
  }
  return absl::InvalidArgumentError(fl::StrCat("tensor dtype ", static_cast<int>(dtype),
                                               " is not a known fl.v1.DType; the peer runs an incompatible build"));
}

fl::v1::ModelSpec ToProto(const core::ModelSpec& spec, std::string_view model_name) {
  fl::v1::ModelSpec out;
  for (const core::TensorSpec& t : spec.tensors()) {
    fl::v1::TensorSpec* p = out.add_tensors();
    p->set_name(t.name);
    for (int64_t d : t.shape) p->add_shape(d);
    p->set_dtype(ToProto(t.dtype));
  }
  out.set_fingerprint(spec.fingerprint());
  out.set_name(std::string(model_name));
  return out;
}

absl::StatusOr<core::ModelSpec> FromProto(const fl::v1::ModelSpec& spec) {
  std::vector<core::TensorSpec> tensors;
  tensors.reserve(spec.tensors_size());
  for (const fl::v1::TensorSpec& t : spec.tensors()) {
    auto dtype = FromProto(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(fl::StrCat("tensor '", t.name(), "': ", fl::ToStd(dtype.status().message())));
    }
    tensors.push_back(core::TensorSpec{t.name(), {t.shape().begin(), t.shape().end()}, *dtype, 0});
  }
  auto built = core::ModelSpec::Create(std::move(tensors));
  if (!built.ok()) return built.status();
  if (built->fingerprint() != spec.fingerprint()) {
    return absl::InvalidArgumentError(
        fl::StrCat("model spec '", spec.name(), "' claims fingerprint ", core::FingerprintToHex(spec.fingerprint()),
                   " but its tensors hash to ", built->FingerprintHex(),
                   "; the sender computes fingerprints differently: use the same fl-testbed version on both sides"));
  }
  return built;
}

std::string_view PhaseName(fl::v1::Phase phase) {
  switch (phase) {
    case fl::v1::PHASE_DOWNLINK: return "downlink";
    case fl::v1::PHASE_TRAIN: return "train";
    case fl::v1::PHASE_EVAL: return "eval";
    case fl::v1::PHASE_UPLINK: return "uplink";
    case fl::v1::PHASE_IDLE: return "idle";
    default: return "unspecified";
  }
}

std::string_view LinkKindName(fl::v1::LinkKind kind) {
  switch (kind) {
    case fl::v1::LINK_KIND_ETHERNET: return "ethernet";
    case fl::v1::LINK_KIND_WIFI: return "wifi";
    case fl::v1::LINK_KIND_5G: return "5g";
    case fl::v1::LINK_KIND_OTHER: return "other";
    default: return "unknown";
  }
}

absl::StatusOr<fl::v1::LinkKind> ParseLinkKind(std::string_view name) {
  for (auto kind :
       {fl::v1::LINK_KIND_ETHERNET, fl::v1::LINK_KIND_WIFI, fl::v1::LINK_KIND_5G, fl::v1::LINK_KIND_OTHER}) {
    if (LinkKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      fl::StrCat("unknown link kind '", name, "'; expected one of ethernet, wifi, 5g, other"));
}

fl::v1::ErrorDetail MakeError(fl::v1::ErrorCode code, std::string message, std::string field, std::string hint) {
  fl::v1::ErrorDetail e;
  e.set_code(code);
  e.set_message(std::move(message));
  e.set_field(std::move(field));
  e.set_hint(std::move(hint));
  return e;
}

grpc::ChannelArguments SessionChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return args;
}

grpc::Status ToGrpcStatus(grpc::StatusCode code, const fl::v1::ErrorDetail& detail) {
  std::string text = detail.message();
  if (!detail.hint().empty()) text += "; " + detail.hint();
  return grpc::Status(code, text, detail.SerializeAsString());
}

fl::v1::ErrorDetail ErrorFromGrpcStatus(const grpc::Status& status) {
  fl::v1::ErrorDetail detail;
  if (!status.error_details().empty() && detail.ParseFromString(status.error_details()) &&
      detail.code() != fl::v1::ERROR_CODE_UNSPECIFIED) {
    return detail;
  }
  detail.Clear();
  detail.set_code(fl::v1::ERROR_CODE_INTERNAL);
  detail.set_message(fl::StrCat("gRPC error ", static_cast<int>(status.error_code()), ": ", status.error_message()));
  return detail;
}

}  // namespace fl::proto

// Raw messages of the gRPC services that register their methods raw (fl-server's Federation, the islands
// coordinator's Islands): each parses what arrives itself, so that a message that does not parse is answered
// INVALID_ARGUMENT naming its type instead of gRPC's empty UNIMPLEMENTED or INTERNAL.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"

namespace fl::rpc {

// Parses one raw message; false when its bytes are not a valid encoding of M (or a string field holds invalid
// UTF-8). Consumes `bytes`.
template <class M>
bool ParseRaw(grpc::ByteBuffer* bytes, M* message) {
  return grpc::SerializationTraits<M>::Deserialize(bytes, message).ok();
}

template <class M>
grpc::ByteBuffer SerializeRaw(const M& message) {
  grpc::ByteBuffer out;
  bool own = false;
  (void)grpc::SerializationTraits<M>::Serialize(message, &out, &own);  // fails only beyond 2 GiB
  return out;
}

// The answer to a message that cannot be parsed: what was expected, where, how big it was, and the schema file
// that defines the type (e.g. "proto/fl/v1/islands.proto").
inline grpc::Status UnparsableMessage(std::string_view what, std::string_view type, size_t bytes,
                                      std::string_view schema) {
  return proto::ToGrpcStatus(
      grpc::StatusCode::INVALID_ARGUMENT,
      proto::MakeError(fl::v1::ERROR_CODE_MALFORMED,
                       fl::StrCat(what, " could not be parsed as ", type, " (", bytes,
                                  " bytes): not a valid protobuf encoding of that message, or a string field holds "
                                  "invalid UTF-8"),
                       "", fl::StrCat("send a serialized ", type, " (", schema, ")")));
}

}  // namespace fl::rpc

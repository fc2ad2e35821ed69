// fl-client's transfers: FederatedClient::Impl's Download (the DownloadModel call: an fp32 model received straight
// into the parameters, the XXH3 check, the header and finite checks, other codecs decoded) and Upload (the
// UploadUpdate call: chunks that refer to the shared upload buffer in place, the XXH3 trailer). Apart from
// session.cc, which runs the session and calls these from its tasks, so that the byte-level transfer code is read
// and changed on its own; the class is in session_impl.h.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/chunk_reader.h"
#include "fl/v1/federation.grpc.pb.h"
#include "session_impl.h"

namespace fl::client {
namespace {

// The transfer RPCs by name, for calls that read and write raw ByteBuffers (the generated stub only speaks
// messages); the names are those of proto/fl/v1/federation.proto's Federation service.
constexpr char kDownloadModelMethod[] = "/fl.v1.Federation/DownloadModel";
constexpr char kUploadUpdateMethod[] = "/fl.v1.Federation/UploadUpdate";

}  // namespace

absl::StatusOr<Downloaded> FederatedClient::Impl::Download(const fl::v1::Task& task) {
  const int64_t start = Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(std::max<uint32_t>(task.deadline_ms(), 1000)));
  fl::v1::DownloadModelRequest req;
  req.set_client_id(client_id_);
  req.set_session_token(token_);
  req.set_task_id(task.task_id());
  req.set_model_version(task.model_version());
  req.set_max_chunk_bytes(options_.max_chunk_bytes);
  // Read as raw ByteBuffers: data chunks go from gRPC's slices straight into the payload and the XXH3 state
  // (proto::DataChunkReader), without a protobuf string per chunk; headers and trailers are parsed as usual.
  auto reader = grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
      channel_.get(),
      grpc::internal::RpcMethod(kDownloadModelMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_), &ctx,
      req);
  grpc::ByteBuffer message;
  fl::v1::ModelChunk chunk;
  fl::v1::ModelHeader header;
  std::vector<uint8_t>& payload = download_bytes_;
  payload.clear();
  download_checksum_.Reset();
  std::optional<uint64_t> checksum;
  bool have_header = false;
  // An fp32 model (the default downlink codec) of this client's size is received in place: the codec header into
  // `head`, the body (the parameters as little-endian floats) straight into global_, so the model is copied once,
  // out of gRPC's slices, instead of into a buffer and then decoded into global_ (a model-sized pass less).
  const size_t num_values = trainer_->spec().num_elements();
  const bool host_is_little_endian = std::endian::native == std::endian::little;
  bool in_place = false;
  std::array<uint8_t, core::kCodecHeaderBytes> head{};
  uint64_t received = 0;
  auto fail = [&](std::string why) {
    ctx.TryCancel();
    reader->Finish();
    return absl::DataLossError(std::move(why));
  };
  auto append = [&](std::span<const uint8_t> piece) {
    download_checksum_.Update(piece);
    if (!in_place) {
      payload.insert(payload.end(), piece.begin(), piece.end());
      received += piece.size();
      return;
    }
    size_t at = 0;
    if (received < head.size()) {
      at = std::min(head.size() - received, piece.size());
      std::memcpy(head.data() + received, piece.data(), at);
    }
    if (at < piece.size()) {
      std::memcpy(reinterpret_cast<uint8_t*>(global_.data()) + (received + at - head.size()), piece.data() + at,
                  piece.size() - at);
    }
    received += piece.size();
  };
  while (reader->Read(&message)) {
    if (have_header) {
      absl::StatusOr<proto::DataChunkReader::Kind> kind =
          download_chunks_.Read(message, header.payload_bytes() - received, append);
      if (!kind.ok()) {
        return fail(kind.status().code() == absl::StatusCode::kOutOfRange
                        ? std::string("the model download carries more bytes than its header announced")
                        : fl::StrCat("the model download is malformed: ", kind.status().message()));
      }
      if (*kind == proto::DataChunkReader::Kind::kData) continue;
    }
    if (!grpc::SerializationTraits<fl::v1::ModelChunk>::Deserialize(&message, &chunk).ok()) {
      return fail("a message of the model download could not be parsed as fl.v1.ModelChunk");
    }
    if (chunk.has_header()) {
      header = chunk.header();
      have_header = true;
      in_place = host_is_little_endian && header.codec() == "fp32" &&
                 header.payload_bytes() == core::kCodecHeaderBytes + uint64_t{num_values} * sizeof(float);
      if (in_place) {
        global_.resize(num_values);
      } else {
        payload.reserve(header.payload_bytes());
      }
    } else if (chunk.part_case() == fl::v1::ModelChunk::kData) {
      if (!have_header || received + chunk.data().size() > header.payload_bytes()) {
        return fail("the model download carries more bytes than its header announced");
      }
      append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(chunk.data().data()), chunk.data().size()));
    } else if (chunk.has_trailer()) {
      checksum = chunk.trailer().payload_checksum();
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return absl::UnavailableError(fl::StrCat("model download failed: ", status.error_message()));
  }
  if (!have_header || !checksum.has_value() || received != header.payload_bytes() ||
      download_checksum_.Digest() != *checksum) {
    return absl::DataLossError(fl::StrCat("the model download is incomplete or damaged (", received, " of ",
                                          header.payload_bytes(), " bytes, checksum ",
                                          checksum.has_value() ? "mismatch" : "missing", ")"));
  }
  const int64_t received_ns = Now();
  if (header.spec().fingerprint() != trainer_->spec().fingerprint()) {
    return absl::FailedPreconditionError(
        fl::StrCat("the server's model has fingerprint ", core::FingerprintToHex(header.spec().fingerprint()),
                   " but this client's ", trainer_->model_name(), " has ", trainer_->spec().FingerprintHex(),
                   "; start the client with the server's model"));
  }
  auto codec = core::MakeCodec(header.codec());
  if (!codec.ok()) return codec.status();
  Downloaded d;
  if (in_place) {
    // What Decode checks, less the body checksum (the XXH3 above verified these bytes): the header, and that
    // every value is finite.
    absl::StatusOr<core::PayloadInfo> info = core::PeekPayloadHeader(head, received);
    if (!info.ok()) return info.status();
    if (info->kind != core::CodecKind::kFp32 || info->num_values != num_values) {
      return absl::InvalidArgumentError(fl::StrCat("the model download's header says ", info->num_values, " ",
                                                   core::CodecKindName(info->kind), " values but the server announced ",
                                                   num_values, " fp32 values: the server's payload is inconsistent"));
    }
    if (absl::Status s = core::CheckFinite(global_, "the downloaded model", &trainer_->spec()); !s.ok()) return s;
  } else {
    global_.resize(num_values);
    // The XXH3 above verified these bytes: the codec's body checksum would be a second pass over them.
    if (absl::Status s = (*codec)->Decode(payload, global_, core::DecodeOptions{.transfer_verified = true}); !s.ok()) {
      return s;
    }
  }
  d.model_version = header.model_version();
  d.bytes = received;
  d.timing = Phase(fl::v1::PHASE_DOWNLINK, start, received_ns, received);
  return d;
}

absl::StatusOr<fl::v1::UploadUpdateResponse> FederatedClient::Impl::Upload(
    fl::v1::UpdateHeader header, std::shared_ptr<const std::vector<uint8_t>> payload, uint32_t deadline_ms) {
  header.set_client_id(client_id_);
  header.set_session_token(token_);
  header.set_payload_bytes(payload->size());
  header.set_upload_started_client_ns(Now());
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfterMs(std::max<uint32_t>(deadline_ms, 1000)));
  fl::v1::UploadUpdateResponse resp;
  // Written as raw ByteBuffers: each data chunk is encoded by hand (proto::EncodeDataChunk), its bytes copied
  // once into the message and into the XXH3 state as they go, instead of into a protobuf string then a buffer.
  auto writer = grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      channel_.get(),
      grpc::internal::RpcMethod(kUploadUpdateMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, channel_), &ctx,
      &resp);
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = header;
  auto serialize = [](const fl::v1::UpdateChunk& m) {
    grpc::ByteBuffer out;
    bool own = false;
    (void)grpc::SerializationTraits<fl::v1::UpdateChunk>::Serialize(m, &out, &own);  // a header: far below 2 GiB
    return out;
  };
  // A false Write means the server already answered (a refusal) or the stream broke: Finish says which.
  bool open = writer->Write(serialize(chunk));
  const size_t chunk_bytes = std::min<size_t>(options_.max_chunk_bytes, server_max_chunk_);
  core::TransferChecksum& sum = upload_checksum_;
  sum.Reset();
  for (size_t off = 0; open && off < payload->size(); off += chunk_bytes) {
    const std::span<const uint8_t> piece(payload->data() + off, std::min(chunk_bytes, payload->size() - off));
    sum.Update(piece);
    open = writer->Write(proto::EncodeDataChunkInPlace(piece, payload));
  }
  if (open) {
    chunk.Clear();
    chunk.mutable_trailer()->set_payload_checksum(sum.Digest());
    open = writer->Write(serialize(chunk));
  }
  if (open) writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!status.ok()) {
    return absl::UnavailableError(fl::StrCat("upload failed: ", status.error_message()));
  }
  return resp;
}

}  // namespace fl::client

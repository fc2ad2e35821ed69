// The round engine's upload slots (engine_transfers.h).
#include "engine_transfers.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"

namespace fl::server::engine {

namespace {
constexpr int64_t kMsToNs = 1'000'000;
}  // namespace

std::vector<uint8_t> UploadSlots::TakeBuffer() {
  std::vector<uint8_t> buffer;
  if (!free_buffers_.empty()) {
    buffer = std::move(free_buffers_.back());
    free_buffers_.pop_back();
  }
  return buffer;
}

void UploadSlots::ReturnBuffer(std::vector<uint8_t> buffer) {
  buffer.clear();
  if (free_buffers_.size() < slots_) {
    free_buffers_.push_back(std::move(buffer));
  }
}

void UploadSlots::Watch(std::shared_ptr<UploadHandle> handle, std::string client_id, std::string task_id,
                        int64_t granted_ns, uint64_t payload_bytes) {
  Active up;
  up.handle = std::move(handle);
  up.client_id = std::move(client_id);
  up.task_id = std::move(task_id);
  up.granted_ns = granted_ns;
  up.payload_bytes = payload_bytes;
  up.progress.emplace_back(granted_ns, 0);
  active_.push_back(std::move(up));
}

void UploadSlots::Unwatch(const UploadHandle* handle) {
  std::erase_if(active_, [&](const Active& up) { return up.handle.get() == handle; });
}

void UploadSlots::MoveOn(int64_t stall_ns) {
  for (Active& up : active_) {
    up.granted_ns += stall_ns;
    up.last_progress_ns = std::max(up.last_progress_ns, up.handle->last_message_ns()) + stall_ns;
    for (auto& sample : up.progress) sample.first += stall_ns;
  }
}

std::vector<UploadSlots::Revocation> UploadSlots::Judge(int64_t now, const UploadLimits& limits) {
  std::vector<Revocation> out;
  const double min_rate = limits.min_bytes_per_s;
  for (Active& up : active_) {
    if (up.revoked) continue;
    up.last_progress_ns = std::max(up.last_progress_ns, up.handle->last_message_ns());
    const int64_t last = std::max(up.granted_ns, up.last_progress_ns);
    const int64_t held_ns = now - up.granted_ns;
    const uint64_t bytes = up.handle->bytes_received();
    if (up.progress.empty() || up.progress.back().second != bytes) up.progress.emplace_back(now, bytes);
    // The recent window: kProgressWindowNs, or four chunks at the pace the upload has shown while it sent (the
    // reactor counts whole messages only, so a slow link's chunk in transit must not look like a stall). Before
    // its first bytes its pace is unknown (a slow link's first chunk may take seconds): only the average and the
    // message timeout judge it then.
    const bool pace_known = bytes > 0 && last > up.granted_ns;
    int64_t window_ns = kProgressWindowNs;
    if (pace_known) {
      const double pace = static_cast<double>(bytes) / (static_cast<double>(last - up.granted_ns) * 1e-9);
      const double chunk = static_cast<double>(std::min<uint64_t>(limits.max_chunk_bytes, up.payload_bytes));
      window_ns = std::max<int64_t>(window_ns, static_cast<int64_t>(4e9 * chunk / pace));
    }
    // The bytes it had at the window's start: those of the newest sample at or before it (0 before the first).
    while (up.progress.size() > 1 && up.progress[1].first <= now - window_ns) up.progress.pop_front();
    const uint64_t bytes_before = up.progress.front().first <= now - window_ns ? up.progress.front().second : 0;
    grpc::Status status;
    if (limits.message_timeout_ms != 0 && now - last > int64_t{limits.message_timeout_ms} * kMsToNs) {
      status = proto::ToGrpcStatus(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          proto::MakeError(
              fl::v1::ERROR_CODE_RATE_LIMITED,
              fl::StrCat("the upload of client '", up.client_id, "' for task '", up.task_id, "' sent no message for ",
                         (now - last) / kMsToNs, " ms (limit ", limits.message_timeout_ms,
                         " ms, --upload-message-timeout-ms): its upload slot goes to the next client"),
              "", "a stalled upload can be sent again while the round is open"));
    } else if (min_rate != 0 && held_ns > int64_t{limits.rate_grace_ms} * kMsToNs &&
               static_cast<double>(bytes) < min_rate * static_cast<double>(held_ns) * 1e-9) {
      // A trickle: too slow on average since it got the slot.
      const double rate = static_cast<double>(bytes) / (static_cast<double>(held_ns) * 1e-9);
      status = proto::ToGrpcStatus(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          proto::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED,
                           absl::StrFormat("the upload of client '%s' for task '%s' averaged %.0f bytes/s over %.1f s, "
                                           "below the minimum rate of %u bytes/s (--upload-min-bytes-per-s): its "
                                           "upload slot goes to the next client",
                                           up.client_id, up.task_id, rate, static_cast<double>(held_ns) * 1e-9,
                                           limits.min_bytes_per_s),
                           "", "a faster link, a smaller model or a more compact --uplink-codec would help"));
    } else if (min_rate != 0 && pace_known && held_ns >= window_ns &&
               static_cast<double>(bytes - bytes_before) < min_rate * static_cast<double>(window_ns) * 1e-9) {
      // A stall after a fast start: its average stays high for minutes, its recent progress does not (issue 27:
      // 10-20 MB of 32 MB, then nothing, kept the slot past an 8 s round's deadline).
      const double window_s = static_cast<double>(window_ns) * 1e-9;
      status = proto::ToGrpcStatus(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          proto::MakeError(
              fl::v1::ERROR_CODE_RATE_LIMITED,
              absl::StrFormat("the upload of client '%s' for task '%s' received %u bytes in its last %.1f s (%.0f "
                              "bytes/s; %u of %u bytes so far), below the minimum rate of %u bytes/s "
                              "(--upload-min-bytes-per-s) over its most recent window: it stalled, and its upload slot "
                              "goes to the next client",
                              up.client_id, up.task_id, bytes - bytes_before, window_s,
                              static_cast<double>(bytes - bytes_before) / window_s, bytes, up.payload_bytes,
                              limits.min_bytes_per_s),
              "", "the task stays open: its update may be sent again before the round's deadline"));
    } else {
      continue;
    }
    up.revoked = true;
    out.push_back(Revocation{up.handle, up.client_id, up.task_id, std::move(status)});
  }
  return out;
}

}  // namespace fl::server::engine

// The round engine's link-aware compression (--uplink-codec-policy, fl/core/codec_policy.h): the codec each client's
// train task names at dispatch and the decoder of the codec a task named (both the global model's, engine_model.h),
// and each client's measured uplink rate. Kept apart from the dispatch and upload paths so that those carry only a
// call each.
#include <spdlog/spdlog.h>

#include "engine_internal.h"

namespace fl::server {

const std::string& RoundEngine::Core::UplinkCodecFor(const ClientInfo& client) const {
  return model_.UplinkCodecFor(proto::LinkKindName(client.join.link().kind()), client.uplink_bytes_per_s);
}

const core::Codec& RoundEngine::Core::UplinkCodecOf(const TaskInfo& task) const {
  return model_.UplinkCodecOf(task.uplink_codec);
}

void RoundEngine::Core::NoteUplinkRate(const std::string& client_id, uint64_t payload_bytes, int64_t first_byte_ns,
                                       int64_t done_ns) {
  // A transfer too short to time (the same clock reading at both ends) says nothing about the link.
  if (done_ns <= first_byte_ns || payload_bytes == 0) return;
  if (ClientInfo* c = clients_.Find(client_id); c != nullptr) {
    c->uplink_bytes_per_s = static_cast<double>(payload_bytes) * 1e9 / static_cast<double>(done_ns - first_byte_ns);
  }
}

}  // namespace fl::server

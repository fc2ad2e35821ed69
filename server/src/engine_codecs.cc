// The round engine's link-aware compression (--uplink-codec-policy, fl/core/codec_policy.h): the codec each client's
// train task names at dispatch, the decoder of the codec a task named, and each client's measured uplink rate.
// Kept apart from the dispatch and upload paths so that those carry only a call each.
#include <spdlog/spdlog.h>

#include "engine_internal.h"

namespace fl::server {

absl::Status RoundEngine::Core::PrepareUplinkCodecs() {
  auto policy = core::ParseCodecPolicy(config_.uplink_codec_policy, config_.uplink_codec);
  if (!policy.ok()) return policy.status();
  codec_policy_ = std::move(*policy);
  uplink_codecs_.clear();
  for (const std::string& name : codec_policy_.Codecs()) {
    auto codec = core::MakeCodec(name);
    if (!codec.ok()) return codec.status();  // ParseCodecPolicy made each once: not reached
    uplink_codecs_.emplace(name, std::move(*codec));
  }
  if (codec_policy_.basis != core::CodecPolicy::Basis::kFixed) {
    spdlog::info("uplink codec per client: {}", codec_policy_.ToString());
  }
  return absl::OkStatus();
}

const std::string& RoundEngine::Core::UplinkCodecFor(const ClientInfo& client) const {
  return core::ChooseUplinkCodec(codec_policy_, proto::LinkKindName(client.join.link().kind()),
                                 client.uplink_bytes_per_s);
}

const core::Codec& RoundEngine::Core::UplinkCodecOf(const TaskInfo& task) const {
  if (task.uplink_codec.empty()) return *uplink_codec_;
  if (auto it = uplink_codecs_.find(task.uplink_codec); it != uplink_codecs_.end()) return *it->second;
  return *uplink_codec_;  // every codec a task can name is in uplink_codecs_: not reached
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

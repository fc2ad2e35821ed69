// Conversions between the islands' C++ types (coordinator_client.h) and fl.v1 islands.proto messages.
#pragma once

#include "fl/diloco/coord/coordinator_client.h"
#include "fl/v1/islands.pb.h"

namespace fl::diloco {

inline fl::v1::IslandSchedule ToProto(const IslandSchedule& s) {
  fl::v1::IslandSchedule p;
  p.set_inner_steps(s.inner_steps);
  p.set_num_fragments(s.num_fragments);
  p.set_fragment_strategy(s.fragment_strategy);
  p.set_overlap_steps(s.overlap_steps);
  p.set_mixing_alpha(s.mixing_alpha);
  p.set_outer_optimizer(s.outer_optimizer);
  p.set_codec(s.codec);
  p.set_error_feedback(s.error_feedback);
  p.set_connections_per_peer(s.connections_per_peer);
  p.set_total_outer_steps(s.total_outer_steps);
  p.set_exchange_timeout_ms(s.exchange_timeout_ms);
  for (const auto& [k, v] : s.options) (*p.mutable_options())[k] = v;
  p.set_sync_mode(s.sync_mode);
  return p;
}

inline IslandSchedule FromProto(const fl::v1::IslandSchedule& p) {
  IslandSchedule s;
  s.inner_steps = p.inner_steps();
  s.num_fragments = p.num_fragments();
  s.fragment_strategy = p.fragment_strategy();
  s.overlap_steps = p.overlap_steps();
  s.mixing_alpha = p.mixing_alpha();
  s.outer_optimizer = p.outer_optimizer();
  s.codec = p.codec();
  s.error_feedback = p.error_feedback();
  s.connections_per_peer = p.connections_per_peer();
  s.total_outer_steps = p.total_outer_steps();
  s.exchange_timeout_ms = p.exchange_timeout_ms();
  for (const auto& [k, v] : p.options()) s.options[k] = v;
  s.sync_mode = p.sync_mode().empty() ? "diloco" : p.sync_mode();  // a coordinator from before the field
  return s;
}

inline fl::v1::IslandJoinRequest ToProto(const IslandJoinRequest& r) {
  fl::v1::IslandJoinRequest p;
  p.set_protocol_version(1);
  p.set_island_id(r.island_id);
  p.set_data_endpoint(r.data_endpoint);
  p.set_state_endpoint(r.state_endpoint);
  p.set_num_ranks(r.num_ranks);
  p.set_model_fingerprint(r.model_fingerprint);
  p.set_model_name(r.model_name);
  p.set_software_version(r.software_version);
  p.set_device_class(r.device_class);
  p.set_accelerator(r.accelerator);
  p.set_sync_mode(r.sync_mode);
  return p;
}

inline IslandJoinRequest FromProto(const fl::v1::IslandJoinRequest& p) {
  IslandJoinRequest r;
  r.island_id = p.island_id();
  r.data_endpoint = p.data_endpoint();
  r.state_endpoint = p.state_endpoint();
  r.num_ranks = p.num_ranks();
  r.model_fingerprint = p.model_fingerprint();
  r.model_name = p.model_name();
  r.software_version = p.software_version();
  r.device_class = p.device_class();
  r.accelerator = p.accelerator();
  r.sync_mode = p.sync_mode().empty() ? "diloco" : p.sync_mode();  // an fl-island from before the field
  return r;
}

inline fl::v1::SyncStats ToProto(const SyncStats& s) {
  fl::v1::SyncStats p;
  p.set_inner_compute_seconds(s.inner_compute_seconds);
  p.set_exchange_seconds(s.exchange_seconds);
  p.set_bytes_sent(s.bytes_sent);
  p.set_bytes_received(s.bytes_received);
  p.set_wait_seconds(s.wait_seconds);
  p.set_inner_steps(s.inner_steps);
  return p;
}

inline SyncStats FromProto(const fl::v1::SyncStats& p) {
  SyncStats s;
  s.inner_compute_seconds = p.inner_compute_seconds();
  s.exchange_seconds = p.exchange_seconds();
  s.bytes_sent = p.bytes_sent();
  s.bytes_received = p.bytes_received();
  s.wait_seconds = p.wait_seconds();
  s.inner_steps = p.inner_steps();
  return s;
}

inline fl::v1::SyncId ToProto(const SyncKey& k) {
  fl::v1::SyncId p;
  p.set_step(k.step);
  p.set_fragment(k.fragment);
  return p;
}

inline SyncKey FromProto(const fl::v1::SyncId& p) { return SyncKey{p.step(), p.fragment()}; }

inline StateSource FromProto(const fl::v1::StateSource& p) {
  return StateSource{p.island_id(), p.endpoint(), p.expected_hash(), FromProto(p.key())};
}

}  // namespace fl::diloco

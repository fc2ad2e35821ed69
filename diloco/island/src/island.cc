// Torch-free parts of island.h: option validation and the summary's JSON.
#include <nlohmann/json.hpp>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/island.h"

namespace fl::diloco {

absl::Status IslandOptions::Validate() const {
  auto bad = [](std::string_view field, const auto& value, std::string_view want) {
    return absl::InvalidArgumentError(fl::StrCat(field, " is '", value, "'; ", want));
  };
  if (island_id.empty()) return bad("island_id", island_id, "give every island a unique non-empty id");
  if (num_shards < 1 || shard >= num_shards) return bad("shard", shard, fl::StrCat("use 0..", num_shards - 1));
  if (ranks < 1 || rank >= ranks) return bad("rank", rank, fl::StrCat("use 0..", ranks - 1, " (ranks = ", ranks, ")"));
  if (threads < 0) return bad("threads", threads, "use 0 (LibTorch's default) or more");
  if (batch_size < 1) return bad("batch_size", batch_size, "use at least 1");
  if (model == "char-lm" && (context < 2 || d_model < 1 || num_layers < 1 || num_heads < 1 || d_model % num_heads)) {
    return absl::InvalidArgumentError(fl::StrCat("char-lm: context ", context, ", d_model ", d_model, ", layers ",
                                                 num_layers, ", heads ", num_heads,
                                                 ": need context >= 2 and heads dividing d_model"));
  }
  if (!(inner_lr > 0) || !(inner_lr < 1)) return bad("inner_lr", inner_lr, "use a value in (0, 1), e.g. 1e-3");
  if (weight_decay < 0) return bad("weight_decay", weight_decay, "use a value >= 0");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return absl::InvalidArgumentError(fl::StrCat("AdamW betas (", beta1, ", ", beta2, ") must lie in [0, 1)"));
  }
  if (total_steps < 1) return bad("total_steps", total_steps, "use at least 1");
  if (!(exchange_timeout_s > 0))
    return bad("exchange_timeout_s", exchange_timeout_s, "use a positive number of seconds");
  if (absl::StatusOr<std::unique_ptr<core::Codec>> c = core::MakeCodec(codec); !c.ok()) return c.status();
  if (mode == "diloco") {
    if (absl::Status s = outer.Validate(); !s.ok()) return s;
    if (coordinator.empty() && total_steps % outer.inner_steps != 0) {
      return absl::InvalidArgumentError(fl::StrCat("total_steps ", total_steps, " is not a multiple of H = ",
                                                   outer.inner_steps, ": every fragment must finish its last round"));
    }
  } else if (mode == "data-parallel") {
    if (dp_transport != "gloo" && dp_transport != "ring") return bad("dp_transport", dp_transport, "use gloo or ring");
  } else {
    return bad("mode", mode, "use diloco or data-parallel");
  }
  const bool needs_ring =
      (mode == "diloco" && coordinator.empty()) || (mode == "data-parallel" && dp_transport == "ring");
  if (needs_ring && rank == 0) {
    if (peers.empty()) {
      return absl::InvalidArgumentError(
          "no --coordinator and no --peer list: give the static ring as --peer id=endpoint (every island, in ring "
          "order, this one included) or a coordinator address");
    }
    bool self = false;
    for (const std::string& p : peers) {
      const size_t eq = p.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == p.size()) {
        return bad("peer", p, "write id=endpoint, e.g. island-1=tcp://127.0.0.1:5601");
      }
      self = self || p.substr(0, eq) == island_id;
    }
    if (!self) return bad("peers", island_id, "the static ring must list this island (by its island_id) too");
  }
  return absl::OkStatus();
}

std::string IslandSummary::ToJson() const {
  nlohmann::json j;
  j["island_id"] = island_id;
  j["mode"] = mode;
  j["steps"] = steps;
  j["first_step"] = first_step;
  j["units"] = units;
  j["final_eval_loss"] = final_eval_loss;
  j["final_local_eval_loss"] = final_local_eval_loss;
  j["bytes_sent"] = bytes_sent;
  j["bytes_received"] = bytes_received;
  j["peak_sync_bytes"] = peak_sync_bytes;
  j["syncs"] = syncs;
  j["retries"] = retries;
  j["wall_s"] = wall_s;
  j["compute_s"] = compute_s;
  j["exchange_s"] = exchange_s;
  j["wait_s"] = wait_s;
  j["state_hash"] = core::FingerprintToHex(state_hash);
  j["outer_steps"] = outer_steps;
  j["late_joined"] = late_joined;
  j["local_model_hash"] = core::FingerprintToHex(local_model_hash);
  return j.dump();
}

}  // namespace fl::diloco

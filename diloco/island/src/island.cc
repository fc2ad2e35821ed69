// Torch-free parts of island.h: option validation and the summary's JSON.
#include <nlohmann/json.hpp>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/island/island.h"
#include "fl/diloco/net/ring_allreduce.h"
#include "fl/pki/pki.h"

namespace fl::diloco {

OneBitAdamOptions IslandOptions::OneBit() const {
  OneBitAdamOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.weight_decay = weight_decay;
  o.warmup_steps = onebit_warmup_steps;
  o.total_steps = total_steps;
  o.chunk = onebit_chunk;
  o.inner_optimizer = inner_optimizer;
  return o;
}

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
  } else if (mode == "onebit-adam") {
    // With a coordinator the run's length is the coordinator's (windows x steps per window): checked again then.
    if (absl::Status s = OneBit().Validate(); !s.ok()) return s;
  } else {
    return bad("mode", mode, "use diloco, data-parallel or onebit-adam");
  }
  if (inner_optimizer != "adamw") return bad("inner_optimizer", inner_optimizer, "use adamw (the only one built)");
  const bool needs_ring = (mode == "diloco" && coordinator.empty()) ||
                          (mode == "data-parallel" && dp_transport == "ring") ||
                          (mode == "onebit-adam" && coordinator.empty());
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
  const int tls_given = int{!tls_ca.empty()} + int{!tls_cert.empty()} + int{!tls_key.empty()};
  if (tls_given != 0 && tls_given != 3) {
    return absl::InvalidArgumentError(
        "--tls-ca, --tls-cert and --tls-key go together: give all three (fl-provision add-island writes the "
        "island's certificate and key, docs/security.md), or none with --insecure");
  }
  if (tls_given == 3 && insecure) {
    return absl::InvalidArgumentError(
        "--insecure and --tls-ca/--tls-cert/--tls-key contradict each other: drop --insecure to use mutual TLS and "
        "CurveZMQ, or the TLS flags to run in plaintext");
  }
  if (!curve_dir.empty() && tls_given == 0) {
    return absl::InvalidArgumentError(
        "--curve-dir needs --tls-ca/--tls-cert/--tls-key (the ring is secured with "
        "the control plane, docs/security.md)");
  }
  if (tls_given == 0 && !insecure && NeedsTransportSecurity()) {
    return absl::InvalidArgumentError(
        "no transport security configured: give --tls-ca, --tls-cert and --tls-key (mutual TLS to the coordinator "
        "and between islands, CurveZMQ on the ring with the keys beside the certificate or in --curve-dir; make "
        "them with fl-provision init/add-island, docs/security.md), or pass --insecure for plaintext on a trusted "
        "network");
  }
  return absl::OkStatus();
}

bool IslandOptions::NeedsTransportSecurity() const {
  if (rank != 0) return false;  // only the leader talks to the coordinator and the ring
  return !coordinator.empty() || mode == "diloco" || mode == "onebit-adam" ||
         (mode == "data-parallel" && dp_transport == "ring");
}

absl::Status IslandOptions::CheckTransportSecurity() const {
  if (!secured() || !NeedsTransportSecurity()) return absl::OkStatus();
  if (absl::Status s = RingCurveSupported(); !s.ok()) return s;
  const std::string dir = CurveDir();
  absl::StatusOr<std::string> secret = pki::ReadCurveKeyFile(fl::StrCat(dir, "/", island_id, ".curve.key"));
  if (!secret.ok()) return secret.status();
  absl::StatusOr<std::string> pub = pki::ReadCurveKeyFile(fl::StrCat(dir, "/", island_id, ".curve.pub"));
  if (!pub.ok()) return pub.status();
  absl::StatusOr<std::string> derived = pki::CurvePublicKey(*secret);
  if (!derived.ok()) return derived.status();
  if (*derived != *pub) {
    return absl::InvalidArgumentError(fl::StrCat("the CurveZMQ keys ", dir, "/", island_id,
                                                 ".curve.key and .curve.pub "
                                                 "are not a pair; reissue them with fl-provision add-island ",
                                                 island_id, " --force"));
  }
  return absl::OkStatus();
}

std::string IslandOptions::CurveDir() const {
  if (!curve_dir.empty()) return curve_dir;
  const size_t slash = tls_cert.rfind('/');
  return slash == std::string::npos ? std::string(".") : tls_cert.substr(0, slash);
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
  j["state_loads"] = state_loads;
  j["state_load_bytes"] = state_load_bytes;
  j["state_load_ms"] = state_load_ms;
  j["fold_bytes_sent"] = fold_bytes_sent;
  j["local_model_hash"] = core::FingerprintToHex(local_model_hash);
  return j.dump();
}

}  // namespace fl::diloco

// The server's side of one SecAgg+ round, driven by the caller (the round engine), which owns time: it forwards
// each client message to the On* call of its stage and closes each stage at its deadline (Close*), after which
// the clients that did not answer are dropped. The library never waits and never reads a clock.
//
//   Create(participants, ...)      the neighbour graph (graph.h); refused: a threshold outside (k/2, k], a
//                                  population beyond the quantisation range (quantize.h)
//   SetupFor(u)                    -> SecAggSetup
//   OnPublicKeys ... CloseAdvertiseKeys()       stage 1
//   NeighbourKeysFor(u)            -> SecAggNeighbourKeys
//   OnShares ... CloseShareKeys()               stage 2; routes the encrypted shares (it cannot read them)
//   MaskingStartFor(u)             -> SecAggMaskingStart
//   OnMaskedChunk ... CloseMaskedUpload()       stage 3; chunks are added to ONE running sum as they arrive,
//                                  in order per client (no per-client buffer of the model's size)
//   UnmaskRequestFor(u)            -> SecAggUnmaskRequest
//   OnUnmaskResponse ... CloseUnmask()          stage 4; reconstructs the survivors' self-mask seeds and the
//                                  dropped clients' mask keys and removes their masks from the sum
//   Result()                        the weighted mean (dequantised) and the total weight
//
// A stage closed with too few clients to reconstruct some secret fails the round (state kFailed, reason
// failure()): the caller keeps its model. A client whose masked upload stopped part way also fails the round:
// its words are already in the running sum and cannot be removed without revealing its update (the engine
// should cancel a client before its upload starts, or let it finish). Every refusal is also recorded as a
// SecurityEvent (events()).
//
// Not thread-safe, on purpose: one owner drives it (the engine's loop thread, which owns all round state).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/secagg/crypto.h"
#include "fl/secagg/events.h"
#include "fl/secagg/graph.h"
#include "fl/secagg/quantize.h"
#include "fl/v1/secagg.pb.h"

namespace fl::secagg {

enum class Stage { kAdvertiseKeys = 0, kShareKeys = 1, kMaskedUpload = 2, kUnmask = 3, kDone = 4, kFailed = 5 };
std::string_view StageName(Stage stage);

struct ServerRoundConfig {
  uint64_t round = 0;
  std::vector<uint64_t> participants;  // distinct client ids
  uint64_t dimension = 0;              // model coordinates
  QuantizationSpec quantization;
  GraphOptions graph;
};

// Bytes of the serialized messages, per client and stage (down: from the server; up: accepted from the client).
struct StageBytes {
  uint64_t down = 0;
  uint64_t up = 0;
};

struct AggregateResult {
  std::vector<float> mean;    // sum_u w_u Q(x_u) / (scale * sum_u w_u)
  uint64_t total_weight = 0;  // sum_u w_u over the survivors
  std::vector<uint64_t> survivors;
};

class ServerRound {
 public:
  // `random`: the graph's seed is drawn from it (RandomSource::System() in production).
  static absl::StatusOr<std::unique_ptr<ServerRound>> Create(ServerRoundConfig config, RandomSource random);

  absl::Status SetupFor(uint64_t client, v1::SecAggSetup* setup);
  absl::Status OnPublicKeys(const v1::SecAggPublicKeys& keys);
  absl::Status CloseAdvertiseKeys();
  absl::Status NeighbourKeysFor(uint64_t client, v1::SecAggNeighbourKeys* keys);
  absl::Status OnShares(const v1::SecAggShares& shares);
  absl::Status CloseShareKeys();
  absl::Status MaskingStartFor(uint64_t client, v1::SecAggMaskingStart* start);
  absl::Status OnMaskedChunk(const v1::SecAggMaskedChunk& chunk);
  // The same with the words already decoded (the zero-copy path of a streamed upload; bytes counted as 4 a word).
  absl::Status OnMaskedWords(uint64_t round, uint64_t client, uint64_t offset, std::span<const uint32_t> words);
  absl::Status CloseMaskedUpload();
  absl::Status UnmaskRequestFor(uint64_t client, v1::SecAggUnmaskRequest* request);
  absl::Status OnUnmaskResponse(const v1::SecAggUnmaskResponse& response);
  absl::Status CloseUnmask();

  absl::StatusOr<AggregateResult> Result() const;

  Stage stage() const { return stage_; }
  const std::string& failure() const { return failure_; }
  const NeighbourGraph& graph() const { return graph_; }
  // What the round refused, in order: at most kMaxEvents, then only counted (events_not_kept()).
  static constexpr size_t kMaxEvents = 1024;
  const std::vector<SecurityEvent>& events() const { return events_; }
  uint64_t events_not_kept() const { return events_not_kept_; }
  // Clients dropped when `stage` closed (did not answer in time, or left with too few neighbours).
  const std::vector<uint64_t>& DroppedAt(Stage stage) const { return dropped_[static_cast<size_t>(stage)]; }
  // Clients still in the round.
  std::vector<uint64_t> Alive() const;
  std::array<StageBytes, 4> BytesOf(uint64_t client) const;
  // What the server holds of the updates: the running sum of masked words (dimension + 1); after CloseUnmask the
  // unmasked sum.
  std::span<const uint32_t> running_sum() const { return sum_; }
  // Which secrets the server reconstructed: (client, SECAGG_SECRET_*). Never both for one client.
  const std::vector<std::pair<uint64_t, v1::SecAggSecret>>& reconstructed() const { return reconstructed_; }

 private:
  struct Client {
    size_t index = 0;  // in graph_.clients
    bool alive = true;
    bool has_keys = false;
    bool has_shares = false;
    bool has_response = false;
    Key encryption_public{};
    Key mask_public{};
    std::vector<v1::SecAggEncryptedShare> inbox;                      // shares addressed to this client
    uint64_t next_word = 0;                                           // masked words received, in order
    std::map<uint64_t, std::array<uint8_t, 1 + kKeyBytes>> revealed;  // owner -> share it revealed
    std::array<StageBytes, 4> bytes{};
  };

  ServerRound() = default;
  absl::Status Refuse(SecurityEventKind kind, uint64_t client, std::string_view message,
                      absl::StatusCode code = absl::StatusCode::kInvalidArgument);
  // The client `id` of a message in `stage`: in the round, alive, the stage open, the round right.
  absl::StatusOr<Client*> Sender(Stage stage, uint64_t round, uint64_t id, std::string_view what);
  absl::Status Fail(SecurityEventKind kind, std::string_view reason);
  void Record(SecurityEvent event);
  // Drops alive clients with fewer than t alive neighbours (themselves included) until none is left to drop.
  void DropIsolated(Stage stage);
  std::vector<uint64_t> AliveNeighbours(uint64_t client) const;
  uint8_t XOf(uint64_t owner, uint64_t holder) const;
  absl::Status CloseStage(Stage stage);
  // Closes stage 1 or 2: drops the clients that did not answer (`answered` false) and then the isolated ones.
  absl::Status CloseKeyStage(Stage stage, bool Client::*answered, std::string_view what);

  ServerRoundConfig config_;
  NeighbourGraph graph_;
  Stage stage_ = Stage::kAdvertiseKeys;
  std::string failure_;
  std::map<uint64_t, Client> clients_;
  std::map<std::string, uint64_t> key_owners_;  // every advertised public key -> its client (repeats refused)
  std::vector<uint64_t> dropped_[4];
  std::set<uint64_t> survivors_;  // U3: complete masked uploads
  std::vector<uint32_t> sum_;
  std::vector<SecurityEvent> events_;
  uint64_t events_not_kept_ = 0;
  std::vector<std::pair<uint64_t, v1::SecAggSecret>> reconstructed_;
};

}  // namespace fl::secagg

// A client's side of one SecAgg+ round (Bonawitz et al. CCS 2017, Bell et al. CCS 2020), driven message by
// message by the caller (fl-client's session), which owns the transport and time:
//
//   Start(SecAggSetup)                 -> SecAggPublicKeys     two fresh X25519 key pairs (share encryption,
//                                                              masks) and a fresh self-mask seed b
//   OnNeighbourKeys(SecAggNeighbourKeys) -> SecAggShares       t-of-k Shamir shares of the mask secret key and
//                                                              of b, one per neighbour, each encrypted for it
//   OnMaskingStart(SecAggMaskingStart, weight)                 the neighbours' shares for us, decrypted; the
//                                                              senders are the mask partners
//   MaskChunk(offset, values) ... MaskWeight()  -> SecAggMaskedChunk   chunk by chunk, in any order:
//        y = w * Q(x) + PRG(b) + sum_{v partner, v > u} PRG(s_uv) - sum_{v partner, v < u} PRG(s_uv)  (mod 2^32)
//   OnUnmaskRequest(SecAggUnmaskRequest) -> SecAggUnmaskResponse   b-shares of the survivors, mask-key shares of
//                                                              the dropped; never both for one client, once
//
// Every refusal is a status naming the value and carrying its SecurityEventKind (events.h); a refused message
// changes nothing (the caller may drop out of the round: the server then treats this client as dropped).
// Not thread-safe: one session drives it; MaskChunk calls for different chunks may not overlap either.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/secagg/crypto.h"
#include "fl/secagg/quantize.h"
#include "fl/v1/secagg.pb.h"

namespace fl::secagg {

class ClientRound {
 public:
  // Checks the setup (threshold within the neighbourhood, quantisation) and answers with the public keys.
  static absl::StatusOr<std::unique_ptr<ClientRound>> Start(const v1::SecAggSetup& setup, RandomSource random,
                                                            v1::SecAggPublicKeys* keys);
  ~ClientRound();
  ClientRound(const ClientRound&) = delete;
  ClientRound& operator=(const ClientRound&) = delete;

  absl::Status OnNeighbourKeys(const v1::SecAggNeighbourKeys& keys, v1::SecAggShares* shares);
  // `weight`: 1..max_weight (FedAvg: the examples trained on, capped by the caller; uniform: 1).
  absl::Status OnMaskingStart(const v1::SecAggMaskingStart& start, uint32_t weight);

  // Masks model coordinates [offset, offset + values.size()) into `words` (same size). Values outside the range
  // are clipped (counted in clipped_values()); NaN or infinity is refused with its index.
  absl::Status MaskChunk(uint64_t offset, std::span<const float> values, std::span<uint32_t> words);
  absl::Status MaskChunk(uint64_t offset, std::span<const float> values, v1::SecAggMaskedChunk* chunk);
  // Masks, in place, words the caller quantised and weighted itself: words[i] = w * Quantize(x[offset + i]) as
  // two's complement, plus whatever integer the caller adds before masking (distributed DP's noise share,
  // privacy/). The caller then owns the range: the round's largest population assumes every word stays within
  // max_weight * range * scale in magnitude, so noise needs its own room in the range.
  absl::Status MaskQuantizedChunk(uint64_t offset, std::span<uint32_t> words);
  // The weight coordinate (index `dimension` of the masked vector), masked, as the last chunk.
  absl::Status MaskWeight(v1::SecAggMaskedChunk* chunk);

  absl::Status OnUnmaskRequest(const v1::SecAggUnmaskRequest& request, v1::SecAggUnmaskResponse* response);

  uint64_t client_id() const { return id_; }
  uint64_t dimension() const { return dimension_; }
  uint64_t clipped_values() const { return clipped_; }
  size_t mask_partners() const { return partners_.size(); }
  uint32_t weight() const { return weight_; }  // set by OnMaskingStart

 private:
  ClientRound() = default;
  struct Neighbour {
    Key encryption_public{};
    Key mask_public{};
    Key share_key{};  // agreed for the encryption of shares
  };
  struct HeldShare {
    uint8_t x = 0;
    std::array<uint8_t, kKeyBytes> mask_key_share{};
    std::array<uint8_t, kKeyBytes> seed_share{};
  };
  enum class Stage { kAdvertised, kShared, kMasking, kRevealed };

  absl::Status CheckRound(uint64_t round, std::string_view what) const;
  absl::Status Mask(uint64_t offset, std::span<uint32_t> words) const;
  absl::Status CheckChunk(uint64_t offset, size_t values, size_t words) const;

  Stage stage_ = Stage::kAdvertised;
  RandomSource random_ = RandomSource::System();
  uint64_t round_ = 0;
  uint64_t id_ = 0;
  std::vector<uint64_t> setup_neighbours_;  // sorted, self included
  uint32_t threshold_ = 0;
  uint64_t dimension_ = 0;
  QuantizationSpec quantization_;
  KeyPair encryption_keys_;
  KeyPair mask_keys_;
  Key self_seed_{};
  std::map<uint64_t, Neighbour> neighbours_;  // advertised, self excluded
  std::map<uint64_t, HeldShare> held_;        // owner -> our share of its secrets (ours included)
  std::map<uint64_t, Key> partners_;          // mask partner -> its round mask key
  Key self_mask_key_{};
  std::vector<SignedKey> masks_;  // the self mask (+1), then each partner's (+1 if its id is larger, else -1)
  uint32_t weight_ = 0;
  uint64_t clipped_ = 0;
};

}  // namespace fl::secagg

#include "fl/secagg/client_round.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "fl/core/str_cat.h"
#include "fl/secagg/events.h"
#include "fl/secagg/shamir.h"

namespace fl::secagg {
namespace {

// A share's plaintext: the holder's x, then its share of the mask secret key, then of the self-mask seed.
constexpr size_t kSharePlaintextBytes = 1 + 2 * kKeyBytes;

absl::Status Refuse(SecurityEventKind kind, std::string_view message,
                    absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  return Refusal(kind, code, message);
}

absl::StatusOr<Key> KeyFrom(const std::string& bytes, std::string_view what, uint64_t owner) {
  Key key{};
  if (bytes.size() != kKeyBytes) {
    return Refuse(SecurityEventKind::kWrongLength, fl::StrCat(what, " of client ", owner, " has ", bytes.size(),
                                                              " bytes; an X25519 public key has ", kKeyBytes));
  }
  std::memcpy(key.data(), bytes.data(), kKeyBytes);
  return key;
}

std::string AsString(const Key& key) { return std::string(key.begin(), key.end()); }

}  // namespace

ClientRound::~ClientRound() {
  Wipe(encryption_keys_.secret_key);
  Wipe(mask_keys_.secret_key);
  Wipe(self_seed_);
  Wipe(self_mask_key_);
  for (auto& [id, n] : neighbours_) Wipe(n.share_key);
  for (auto& [id, key] : partners_) Wipe(key);
  for (SignedKey& m : masks_) Wipe(m.key);
  for (auto& [id, h] : held_) {
    Wipe(h.mask_key_share);
    Wipe(h.seed_share);
  }
}

absl::StatusOr<std::unique_ptr<ClientRound>> ClientRound::Start(const v1::SecAggSetup& setup, RandomSource random,
                                                                v1::SecAggPublicKeys* keys) {
  EnsureSodium();
  std::unique_ptr<ClientRound> c(new ClientRound());
  c->random_ = random;
  c->round_ = setup.round();
  c->id_ = setup.client_id();
  c->setup_neighbours_.assign(setup.neighbours().begin(), setup.neighbours().end());
  std::sort(c->setup_neighbours_.begin(), c->setup_neighbours_.end());
  c->threshold_ = setup.threshold();
  c->dimension_ = setup.dimension();
  c->quantization_ = {setup.quantization().range(), setup.quantization().scale(), setup.quantization().max_weight()};
  const size_t k = c->setup_neighbours_.size();
  if (std::adjacent_find(c->setup_neighbours_.begin(), c->setup_neighbours_.end()) != c->setup_neighbours_.end() ||
      !std::binary_search(c->setup_neighbours_.begin(), c->setup_neighbours_.end(), c->id_) || k < 2 || k > 255) {
    return Refuse(SecurityEventKind::kProtocolViolation,
                  fl::StrCat("secagg setup for client ", c->id_, " of round ", c->round_, " lists ", k,
                             " neighbours with a repeat, or without the client itself, or not 2..255 of them"));
  }
  if (c->threshold_ <= k / 2 || c->threshold_ > k) {
    return Refuse(SecurityEventKind::kThresholdAboveNeighbours,
                  fl::StrCat("secagg threshold ", c->threshold_, " for a neighbourhood of ", k,
                             " clients: it must be in [", k / 2 + 1, ", ", k, "]"));
  }
  if (c->dimension_ == 0 || c->dimension_ >= (uint64_t{1} << 35)) {
    return Refuse(SecurityEventKind::kInvalidInput,
                  fl::StrCat("secagg dimension ", c->dimension_, " must be in [1, 2^35)"));
  }
  if (absl::Status s = ValidateQuantization(c->quantization_); !s.ok()) return s;
  c->encryption_keys_ = NewKeyPair(c->random_);
  c->mask_keys_ = NewKeyPair(c->random_);
  c->random_.Fill(c->self_seed_);
  keys->Clear();
  keys->set_round(c->round_);
  keys->set_client_id(c->id_);
  keys->set_encryption_public_key(AsString(c->encryption_keys_.public_key));
  keys->set_mask_public_key(AsString(c->mask_keys_.public_key));
  return c;
}

absl::Status ClientRound::CheckRound(uint64_t round, std::string_view what) const {
  if (round == round_) return absl::OkStatus();
  return Refuse(SecurityEventKind::kWrongRound,
                fl::StrCat(what, " is for round ", round, ", client ", id_, " is in round ", round_));
}

absl::Status ClientRound::OnNeighbourKeys(const v1::SecAggNeighbourKeys& keys, v1::SecAggShares* shares) {
  if (stage_ != Stage::kAdvertised) {
    return Refuse(SecurityEventKind::kDuplicate, "secagg neighbour keys arrived twice; the first ones stand");
  }
  if (absl::Status s = CheckRound(keys.round(), "secagg neighbour keys"); !s.ok()) return s;
  std::map<uint64_t, Neighbour> advertised;
  std::set<std::string> distinct;
  bool self_seen = false;
  for (const v1::SecAggPublicKeys& entry : keys.neighbours()) {
    if (absl::Status s = CheckRound(entry.round(), fl::StrCat("the keys of client ", entry.client_id())); !s.ok()) {
      return s;
    }
    if (!std::binary_search(setup_neighbours_.begin(), setup_neighbours_.end(), entry.client_id())) {
      return Refuse(SecurityEventKind::kNotInRound, fl::StrCat("secagg keys of client ", entry.client_id(),
                                                               ", which is not a neighbour of client ", id_));
    }
    if (entry.client_id() == id_) {
      if (self_seen || entry.encryption_public_key() != AsString(encryption_keys_.public_key) ||
          entry.mask_public_key() != AsString(mask_keys_.public_key)) {
        return Refuse(SecurityEventKind::kBadKey,
                      fl::StrCat("the neighbour keys list client ", id_, "'s own keys twice or altered"));
      }
      self_seen = true;
      distinct.insert(entry.encryption_public_key());
      distinct.insert(entry.mask_public_key());
      continue;
    }
    if (advertised.contains(entry.client_id())) {
      return Refuse(SecurityEventKind::kDuplicate,
                    fl::StrCat("secagg keys of client ", entry.client_id(), " appear twice"));
    }
    absl::StatusOr<Key> enc = KeyFrom(entry.encryption_public_key(), "the encryption key", entry.client_id());
    if (!enc.ok()) return enc.status();
    absl::StatusOr<Key> mask = KeyFrom(entry.mask_public_key(), "the mask key", entry.client_id());
    if (!mask.ok()) return mask.status();
    distinct.insert(entry.encryption_public_key());
    distinct.insert(entry.mask_public_key());
    absl::StatusOr<Key> share_key =
        AgreeKey(KeyPurpose::kShareEncryption, encryption_keys_.secret_key, encryption_keys_.public_key, *enc);
    if (!share_key.ok()) return share_key.status();
    advertised[entry.client_id()] = Neighbour{*enc, *mask, *share_key};
  }
  if (!self_seen) {
    return Refuse(SecurityEventKind::kProtocolViolation,
                  fl::StrCat("the neighbour keys for client ", id_, " leave out its own keys"));
  }
  if (distinct.size() != 2 * (advertised.size() + 1)) {
    // Bonawitz et al.: all public keys of a round must differ, or a replayed key would pair two masks.
    return Refuse(SecurityEventKind::kBadKey, "two public keys among the neighbour keys are equal; refused");
  }
  if (advertised.size() + 1 < threshold_) {
    return Refuse(SecurityEventKind::kTooFewSurvivors,
                  fl::StrCat("only ", advertised.size() + 1, " of client ", id_, "'s neighbourhood advertised keys; ",
                             threshold_, " are needed to share its secrets"),
                  absl::StatusCode::kFailedPrecondition);
  }
  // Holders: the advertised neighbours and ourselves, each at its x = position in the setup's list + 1.
  std::vector<uint64_t> holders;
  std::vector<uint8_t> xs;
  for (size_t i = 0; i < setup_neighbours_.size(); ++i) {
    const uint64_t v = setup_neighbours_[i];
    if (v != id_ && !advertised.contains(v)) continue;
    holders.push_back(v);
    xs.push_back(static_cast<uint8_t>(i + 1));
  }
  RandomFill fill = random_.AsFill();
  absl::StatusOr<std::vector<Share>> key_shares = ShamirSplit(mask_keys_.secret_key, threshold_, xs, fill);
  if (!key_shares.ok()) return key_shares.status();
  absl::StatusOr<std::vector<Share>> seed_shares = ShamirSplit(self_seed_, threshold_, xs, fill);
  if (!seed_shares.ok()) return seed_shares.status();
  shares->Clear();
  shares->set_round(round_);
  shares->set_client_id(id_);
  for (size_t h = 0; h < holders.size(); ++h) {
    HeldShare plain;
    plain.x = xs[h];
    std::memcpy(plain.mask_key_share.data(), (*key_shares)[h].y.data(), kKeyBytes);
    std::memcpy(plain.seed_share.data(), (*seed_shares)[h].y.data(), kKeyBytes);
    Wipe((*key_shares)[h].y);
    Wipe((*seed_shares)[h].y);
    if (holders[h] == id_) {
      held_[id_] = plain;
      continue;
    }
    std::array<uint8_t, kSharePlaintextBytes> text{};
    text[0] = plain.x;
    std::memcpy(text.data() + 1, plain.mask_key_share.data(), kKeyBytes);
    std::memcpy(text.data() + 1 + kKeyBytes, plain.seed_share.data(), kKeyBytes);
    auto [nonce, ciphertext] =
        Seal(advertised[holders[h]].share_key, ShareAssociatedData(round_, id_, holders[h]), text, random_);
    Wipe(text);
    Wipe(plain.mask_key_share);
    Wipe(plain.seed_share);
    v1::SecAggEncryptedShare* out = shares->add_shares();
    out->set_sender(id_);
    out->set_receiver(holders[h]);
    out->set_nonce(std::move(nonce));
    out->set_ciphertext(std::move(ciphertext));
  }
  neighbours_ = std::move(advertised);
  stage_ = Stage::kShared;
  return absl::OkStatus();
}

absl::Status ClientRound::OnMaskingStart(const v1::SecAggMaskingStart& start, uint32_t weight) {
  if (stage_ != Stage::kShared) {
    return Refuse(SecurityEventKind::kProtocolViolation,
                  "secagg masking start out of order: it follows the neighbour keys, once");
  }
  if (absl::Status s = CheckRound(start.round(), "secagg masking start"); !s.ok()) return s;
  if (weight == 0 || weight > quantization_.max_weight) {
    return Refuse(SecurityEventKind::kInvalidInput,
                  fl::StrCat("secagg weight ", weight, " must be in [1, ", quantization_.max_weight,
                             "] (the round's max_weight); cap the example count at max_weight"));
  }
  std::map<uint64_t, HeldShare> received;
  for (const v1::SecAggEncryptedShare& share : start.shares()) {
    if (share.receiver() != id_) {
      return Refuse(SecurityEventKind::kNotInRound,
                    fl::StrCat("a share for client ", share.receiver(), " reached client ", id_));
    }
    const auto sender = neighbours_.find(share.sender());
    if (sender == neighbours_.end()) {
      return Refuse(SecurityEventKind::kNotInRound, fl::StrCat("a share from client ", share.sender(),
                                                               ", which is not an advertised neighbour of ", id_));
    }
    if (received.contains(share.sender())) {
      return Refuse(SecurityEventKind::kDuplicate, fl::StrCat("two shares from client ", share.sender()));
    }
    absl::StatusOr<std::string> text = Open(sender->second.share_key, ShareAssociatedData(round_, share.sender(), id_),
                                            share.nonce(), share.ciphertext());
    if (!text.ok()) {
      const SecurityEventKind kind = SecurityEventOf(text.status()).value_or(SecurityEventKind::kAuthenticationFailed);
      return Refusal(
          kind, text.status().code(),
          fl::StrCat("the share from client ", share.sender(), " to ", id_, ": ", fl::ToStd(text.status().message())));
    }
    if (text->size() != kSharePlaintextBytes) {
      return Refuse(SecurityEventKind::kWrongLength,
                    fl::StrCat("the share from client ", share.sender(), " has ", text->size(), " bytes, expected ",
                               kSharePlaintextBytes));
    }
    HeldShare held;
    held.x = static_cast<uint8_t>((*text)[0]);
    std::memcpy(held.mask_key_share.data(), text->data() + 1, kKeyBytes);
    std::memcpy(held.seed_share.data(), text->data() + 1 + kKeyBytes, kKeyBytes);
    Wipe(std::span<uint8_t>(reinterpret_cast<uint8_t*>(text->data()), text->size()));
    received[share.sender()] = held;
  }
  if (received.size() + 1 < threshold_) {
    return Refuse(SecurityEventKind::kTooFewSurvivors,
                  fl::StrCat("only ", received.size(), " neighbours of client ", id_, " shared keys; with itself ",
                             received.size() + 1, " < threshold ", threshold_),
                  absl::StatusCode::kFailedPrecondition);
  }
  std::map<uint64_t, Key> partners;
  for (const auto& [v, held] : received) {
    absl::StatusOr<Key> agreed =
        AgreeKey(KeyPurpose::kMask, mask_keys_.secret_key, mask_keys_.public_key, neighbours_[v].mask_public);
    if (!agreed.ok()) return agreed.status();
    partners[v] = RoundMaskKey(*agreed, round_);
    Key wipe = *agreed;
    Wipe(wipe);
  }
  for (auto& [v, held] : received) held_[v] = held;
  partners_ = std::move(partners);
  self_mask_key_ = RoundMaskKey(self_seed_, round_);
  masks_.push_back({self_mask_key_, +1});
  for (const auto& [v, key] : partners_) masks_.push_back({key, v > id_ ? +1 : -1});
  weight_ = weight;
  stage_ = Stage::kMasking;
  return absl::OkStatus();
}

absl::Status ClientRound::Mask(uint64_t offset, std::span<uint32_t> words) const {
  ApplyMasks(masks_, offset, words);
  return absl::OkStatus();
}

absl::Status ClientRound::CheckChunk(uint64_t offset, size_t values, size_t words) const {
  if (stage_ != Stage::kMasking) {
    return Refuse(SecurityEventKind::kProtocolViolation,
                  "secagg masking before the masking start, or after the unmask stage revealed shares");
  }
  if (offset > dimension_ || values > dimension_ - offset || words != values) {
    return Refuse(SecurityEventKind::kWrongLength,
                  fl::StrCat("secagg chunk at offset ", offset, " of ", values, " values into ", words,
                             " words; the model has ", dimension_, " coordinates"));
  }
  return absl::OkStatus();
}

absl::Status ClientRound::MaskQuantizedChunk(uint64_t offset, std::span<uint32_t> words) {
  if (absl::Status s = CheckChunk(offset, words.size(), words.size()); !s.ok()) return s;
  return Mask(offset, words);
}

absl::Status ClientRound::MaskChunk(uint64_t offset, std::span<const float> values, std::span<uint32_t> words) {
  if (absl::Status s = CheckChunk(offset, values.size(), words.size()); !s.ok()) return s;
  const float range = static_cast<float>(quantization_.range);
  for (size_t i = 0; i < values.size(); ++i) {
    const float x = values[i];
    if (!std::isfinite(x)) {
      return Refuse(SecurityEventKind::kInvalidInput, fl::StrCat("update coordinate ", offset + i, " is ", x,
                                                                 "; secure aggregation takes finite values"));
    }
    clipped_ += (x > range || x < -range) ? 1 : 0;
    words[i] = static_cast<uint32_t>(Quantize(quantization_, x)) * weight_;
  }
  return Mask(offset, words);
}

absl::Status ClientRound::MaskChunk(uint64_t offset, std::span<const float> values, v1::SecAggMaskedChunk* chunk) {
  std::vector<uint32_t> words(values.size());
  if (absl::Status s = MaskChunk(offset, values, std::span<uint32_t>(words)); !s.ok()) return s;
  chunk->Clear();
  chunk->set_round(round_);
  chunk->set_client_id(id_);
  chunk->set_offset(offset);
  chunk->set_words(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint32_t));
  return absl::OkStatus();
}

absl::Status ClientRound::MaskWeight(v1::SecAggMaskedChunk* chunk) {
  if (stage_ != Stage::kMasking) {
    return Refuse(SecurityEventKind::kProtocolViolation, "secagg weight masked outside the masking stage");
  }
  uint32_t word = weight_;
  if (absl::Status s = Mask(dimension_, std::span<uint32_t>(&word, 1)); !s.ok()) return s;
  chunk->Clear();
  chunk->set_round(round_);
  chunk->set_client_id(id_);
  chunk->set_offset(dimension_);
  chunk->set_words(reinterpret_cast<const char*>(&word), sizeof(word));
  return absl::OkStatus();
}

absl::Status ClientRound::OnUnmaskRequest(const v1::SecAggUnmaskRequest& request, v1::SecAggUnmaskResponse* response) {
  if (stage_ == Stage::kRevealed) {
    return Refuse(SecurityEventKind::kDuplicate,
                  fl::StrCat("a second unmask request to client ", id_, "; it answers one per round"));
  }
  if (stage_ != Stage::kMasking) {
    return Refuse(SecurityEventKind::kProtocolViolation, "secagg unmask request before the masking stage");
  }
  if (absl::Status s = CheckRound(request.round(), "secagg unmask request"); !s.ok()) return s;
  std::set<uint64_t> asked;
  auto check = [&](uint64_t v, bool survivor) -> absl::Status {
    if (v != id_ && !partners_.contains(v)) {
      return Refuse(SecurityEventKind::kNotInRound,
                    fl::StrCat("the unmask request names client ", v, ", not a mask partner of client ", id_));
    }
    if (!asked.insert(v).second) {
      // The core of SecAgg's security: b and the mask key of one client together unmask its update.
      return Refuse(SecurityEventKind::kProtocolViolation,
                    fl::StrCat("the unmask request names client ", v,
                               " twice (as survivor and dropped?); both of its secrets are never revealed"));
    }
    if (v == id_ && !survivor) {
      return Refuse(SecurityEventKind::kProtocolViolation,
                    fl::StrCat("the unmask request asks client ", id_, " for its own mask key: refused"));
    }
    return absl::OkStatus();
  };
  for (uint64_t v : request.survivors()) {
    if (absl::Status s = check(v, true); !s.ok()) return s;
  }
  for (uint64_t v : request.dropped()) {
    if (absl::Status s = check(v, false); !s.ok()) return s;
  }
  if (!asked.contains(id_)) {
    return Refuse(SecurityEventKind::kProtocolViolation,
                  fl::StrCat("the unmask request to client ", id_, " does not count it among the survivors"));
  }
  if (static_cast<size_t>(request.survivors_size()) < threshold_) {
    return Refuse(SecurityEventKind::kTooFewSurvivors,
                  fl::StrCat("the unmask request names ", request.survivors_size(),
                             " survivors, fewer than the threshold ", threshold_, ": client ", id_, " reveals nothing"),
                  absl::StatusCode::kFailedPrecondition);
  }
  response->Clear();
  response->set_round(round_);
  response->set_client_id(id_);
  auto reveal = [&](uint64_t owner, v1::SecAggSecret secret) {
    const HeldShare& held = held_[owner];
    const auto& bytes = secret == v1::SECAGG_SECRET_SELF_MASK_SEED ? held.seed_share : held.mask_key_share;
    v1::SecAggRevealedShare* out = response->add_shares();
    out->set_owner(owner);
    out->set_secret(secret);
    std::string share(1 + kKeyBytes, '\0');
    share[0] = static_cast<char>(held.x);
    std::memcpy(share.data() + 1, bytes.data(), kKeyBytes);
    out->set_share(std::move(share));
  };
  for (uint64_t v : request.survivors()) reveal(v, v1::SECAGG_SECRET_SELF_MASK_SEED);
  for (uint64_t v : request.dropped()) reveal(v, v1::SECAGG_SECRET_MASK_KEY);
  stage_ = Stage::kRevealed;
  return absl::OkStatus();
}

}  // namespace fl::secagg

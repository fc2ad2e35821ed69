#include "fl/secagg/server_round.h"

#include <algorithm>
#include <cstring>

#include "fl/core/str_cat.h"
#include "fl/secagg/shamir.h"

namespace fl::secagg {
namespace {

constexpr size_t kShareCiphertextBytes = 1 + 2 * kKeyBytes + kTagBytes;

std::string List(std::span<const uint64_t> ids) {
  std::string out;
  for (uint64_t id : ids) out += fl::StrCat(out.empty() ? "" : ", ", id);
  return out;
}

}  // namespace

std::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kAdvertiseKeys: return "advertise_keys";
    case Stage::kShareKeys: return "share_keys";
    case Stage::kMaskedUpload: return "masked_upload";
    case Stage::kUnmask: return "unmask";
    case Stage::kDone: return "done";
    case Stage::kFailed: return "failed";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ServerRound>> ServerRound::Create(ServerRoundConfig config, RandomSource random) {
  EnsureSodium();
  if (config.dimension == 0 || config.dimension >= (uint64_t{1} << 35)) {
    return Refusal(SecurityEventKind::kInvalidInput, absl::StatusCode::kInvalidArgument,
                   fl::StrCat("secagg dimension ", config.dimension, " must be in [1, 2^35)"));
  }
  if (absl::Status s = CheckPopulation(config.quantization, config.participants.size()); !s.ok()) return s;
  uint64_t seed = 0;
  random.Fill(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&seed), sizeof(seed)));
  absl::StatusOr<NeighbourGraph> graph = BuildNeighbourGraph(config.participants, config.graph, seed);
  if (!graph.ok()) return graph.status();
  std::unique_ptr<ServerRound> r(new ServerRound());
  r->config_ = std::move(config);
  r->graph_ = *std::move(graph);
  for (size_t i = 0; i < r->graph_.clients.size(); ++i) r->clients_[r->graph_.clients[i]].index = i;
  return r;
}

absl::Status ServerRound::Refuse(SecurityEventKind kind, uint64_t client, std::string_view message,
                                 absl::StatusCode code) {
  Record({kind, client, std::string(message)});
  return Refusal(kind, code, message);
}

void ServerRound::Record(SecurityEvent event) {
  // A hostile client could send refused messages without end: the round keeps the first kMaxEvents and counts
  // the rest (the engine's own budget of security_events rows applies after that).
  if (events_.size() < kMaxEvents) {
    events_.push_back(std::move(event));
  } else {
    ++events_not_kept_;
  }
}

absl::Status ServerRound::Fail(SecurityEventKind kind, std::string_view reason) {
  stage_ = Stage::kFailed;
  failure_ = fl::StrCat("secure aggregation of round ", config_.round, " failed: ", reason,
                        "; the round's update is discarded and the model kept");
  std::fill(sum_.begin(), sum_.end(), 0u);  // nothing partly unmasked stays behind
  Record({kind, 0, failure_});
  return Refusal(kind, absl::StatusCode::kFailedPrecondition, failure_);
}

absl::StatusOr<ServerRound::Client*> ServerRound::Sender(Stage stage, uint64_t round, uint64_t id,
                                                         std::string_view what) {
  if (round != config_.round) {
    return Refuse(SecurityEventKind::kWrongRound, id,
                  fl::StrCat(what, " from client ", id, " is for round ", round, "; this is round ", config_.round));
  }
  const auto it = clients_.find(id);
  if (it == clients_.end()) {
    return Refuse(SecurityEventKind::kNotInRound, id,
                  fl::StrCat(what, " from client ", id, ", which is not a participant of round ", config_.round));
  }
  if (stage_ != stage) {
    return Refuse(SecurityEventKind::kProtocolViolation, id,
                  fl::StrCat(what, " from client ", id, " belongs to stage ", StageName(stage), "; round ",
                             config_.round, " is at stage ", StageName(stage_)),
                  absl::StatusCode::kFailedPrecondition);
  }
  if (!it->second.alive) {
    return Refuse(SecurityEventKind::kNotInRound, id,
                  fl::StrCat(what, " from client ", id, ", which was dropped from round ", config_.round));
  }
  return &it->second;
}

std::vector<uint64_t> ServerRound::Alive() const {
  std::vector<uint64_t> out;
  for (const auto& [id, c] : clients_) {
    if (c.alive) out.push_back(id);
  }
  return out;
}

std::vector<uint64_t> ServerRound::AliveNeighbours(uint64_t client) const {
  std::vector<uint64_t> out;
  for (uint64_t v : graph_.NeighbourhoodOf(client)) {
    if (clients_.at(v).alive) out.push_back(v);
  }
  return out;
}

uint8_t ServerRound::XOf(uint64_t owner, uint64_t holder) const {
  const std::span<const uint64_t> hood = graph_.NeighbourhoodOf(owner);
  return static_cast<uint8_t>(std::lower_bound(hood.begin(), hood.end(), holder) - hood.begin() + 1);
}

std::array<StageBytes, 4> ServerRound::BytesOf(uint64_t client) const {
  const auto it = clients_.find(client);
  return it == clients_.end() ? std::array<StageBytes, 4>{} : it->second.bytes;
}

void ServerRound::DropIsolated(Stage stage) {
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& [id, c] : clients_) {
      if (!c.alive || AliveNeighbours(id).size() >= graph_.threshold) continue;
      c.alive = false;
      dropped_[static_cast<size_t>(stage)].push_back(id);
      changed = true;
    }
  }
}

absl::Status ServerRound::SetupFor(uint64_t client, v1::SecAggSetup* setup) {
  const auto it = clients_.find(client);
  if (it == clients_.end() || stage_ != Stage::kAdvertiseKeys) {
    return absl::FailedPreconditionError(fl::StrCat("no secagg setup for client ", client, " in round ", config_.round,
                                                    " at stage ", StageName(stage_)));
  }
  setup->Clear();
  setup->set_round(config_.round);
  setup->set_client_id(client);
  for (uint64_t v : graph_.NeighbourhoodOf(client)) setup->add_neighbours(v);
  setup->set_threshold(graph_.threshold);
  setup->set_dimension(config_.dimension);
  setup->mutable_quantization()->set_range(config_.quantization.range);
  setup->mutable_quantization()->set_scale(config_.quantization.scale);
  setup->mutable_quantization()->set_max_weight(config_.quantization.max_weight);
  it->second.bytes[0].down += setup->ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::OnPublicKeys(const v1::SecAggPublicKeys& keys) {
  absl::StatusOr<Client*> c = Sender(Stage::kAdvertiseKeys, keys.round(), keys.client_id(), "secagg public keys");
  if (!c.ok()) return c.status();
  const uint64_t id = keys.client_id();
  if ((*c)->has_keys)
    return Refuse(SecurityEventKind::kDuplicate, id, fl::StrCat("client ", id, " sent its keys twice"));
  if (keys.encryption_public_key().size() != kKeyBytes || keys.mask_public_key().size() != kKeyBytes) {
    return Refuse(SecurityEventKind::kWrongLength, id,
                  fl::StrCat("client ", id, "'s public keys have ", keys.encryption_public_key().size(), " and ",
                             keys.mask_public_key().size(), " bytes; X25519 keys have ", kKeyBytes));
  }
  if (keys.encryption_public_key() == keys.mask_public_key()) {
    return Refuse(SecurityEventKind::kBadKey, id, fl::StrCat("client ", id, " sent the same key twice"));
  }
  for (const std::string* key : {&keys.encryption_public_key(), &keys.mask_public_key()}) {
    if (const auto known = key_owners_.find(*key); known != key_owners_.end()) {
      return Refuse(SecurityEventKind::kBadKey, id,
                    fl::StrCat("client ", id, " advertised a public key of client ", known->second, "; refused"));
    }
  }
  key_owners_[keys.encryption_public_key()] = id;
  key_owners_[keys.mask_public_key()] = id;
  std::memcpy((*c)->encryption_public.data(), keys.encryption_public_key().data(), kKeyBytes);
  std::memcpy((*c)->mask_public.data(), keys.mask_public_key().data(), kKeyBytes);
  (*c)->has_keys = true;
  (*c)->bytes[0].up += keys.ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::CloseStage(Stage stage) {
  if (stage_ != stage) {
    return absl::FailedPreconditionError(fl::StrCat("closing stage ", StageName(stage), " of round ", config_.round,
                                                    ", which is at stage ", StageName(stage_)));
  }
  return absl::OkStatus();
}

absl::Status ServerRound::CloseKeyStage(Stage stage, bool Client::*answered, std::string_view what) {
  if (absl::Status s = CloseStage(stage); !s.ok()) return s;
  for (auto& [id, c] : clients_) {
    if (c.alive && !(c.*answered)) {
      c.alive = false;
      dropped_[static_cast<size_t>(stage)].push_back(id);
    }
  }
  DropIsolated(stage);
  if (Alive().empty()) {
    return Fail(SecurityEventKind::kTooFewSurvivors,
                fl::StrCat("no client has ", graph_.threshold, " neighbours (threshold) that ", what));
  }
  return absl::OkStatus();
}

absl::Status ServerRound::CloseAdvertiseKeys() {
  if (absl::Status s = CloseKeyStage(Stage::kAdvertiseKeys, &Client::has_keys, "advertised keys"); !s.ok()) return s;
  stage_ = Stage::kShareKeys;
  return absl::OkStatus();
}

absl::Status ServerRound::NeighbourKeysFor(uint64_t client, v1::SecAggNeighbourKeys* keys) {
  const auto it = clients_.find(client);
  if (it == clients_.end() || !it->second.alive || stage_ != Stage::kShareKeys) {
    return absl::FailedPreconditionError(fl::StrCat("no neighbour keys for client ", client, " in round ",
                                                    config_.round, " at stage ", StageName(stage_)));
  }
  keys->Clear();
  keys->set_round(config_.round);
  for (uint64_t v : AliveNeighbours(client)) {
    const Client& c = clients_.at(v);
    v1::SecAggPublicKeys* entry = keys->add_neighbours();
    entry->set_round(config_.round);
    entry->set_client_id(v);
    entry->set_encryption_public_key(std::string(c.encryption_public.begin(), c.encryption_public.end()));
    entry->set_mask_public_key(std::string(c.mask_public.begin(), c.mask_public.end()));
  }
  it->second.bytes[1].down += keys->ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::OnShares(const v1::SecAggShares& shares) {
  absl::StatusOr<Client*> c = Sender(Stage::kShareKeys, shares.round(), shares.client_id(), "secagg shares");
  if (!c.ok()) return c.status();
  const uint64_t id = shares.client_id();
  if ((*c)->has_shares)
    return Refuse(SecurityEventKind::kDuplicate, id, fl::StrCat("client ", id, " sent its shares twice"));
  std::vector<uint64_t> expected = AliveNeighbours(id);
  expected.erase(std::find(expected.begin(), expected.end(), id));
  std::set<uint64_t> seen;
  for (const v1::SecAggEncryptedShare& s : shares.shares()) {
    if (s.sender() != id || !std::binary_search(expected.begin(), expected.end(), s.receiver())) {
      return Refuse(
          SecurityEventKind::kNotInRound, id,
          fl::StrCat("client ", id, " sent a share from ", s.sender(), " to ", s.receiver(),
                     "; its shares go from itself to its neighbours still in the round (", List(expected), ")"));
    }
    if (!seen.insert(s.receiver()).second) {
      return Refuse(SecurityEventKind::kDuplicate, id,
                    fl::StrCat("client ", id, " sent two shares to client ", s.receiver()));
    }
    if (s.nonce().size() != kNonceBytes || s.ciphertext().size() != kShareCiphertextBytes) {
      return Refuse(SecurityEventKind::kWrongLength, id,
                    fl::StrCat("client ", id, "'s share for ", s.receiver(), " has a ", s.nonce().size(),
                               "-byte nonce and a ", s.ciphertext().size(), "-byte ciphertext; expected ", kNonceBytes,
                               " and ", kShareCiphertextBytes));
    }
  }
  if (seen.size() != expected.size()) {
    return Refuse(SecurityEventKind::kWrongLength, id,
                  fl::StrCat("client ", id, " sent ", seen.size(), " shares; it has ", expected.size(),
                             " neighbours in the round (", List(expected), ")"));
  }
  for (const v1::SecAggEncryptedShare& s : shares.shares()) clients_.at(s.receiver()).inbox.push_back(s);
  (*c)->has_shares = true;
  (*c)->bytes[1].up += shares.ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::CloseShareKeys() {
  if (absl::Status s = CloseKeyStage(Stage::kShareKeys, &Client::has_shares, "shared keys"); !s.ok()) return s;
  sum_.assign(config_.dimension + 1, 0u);
  stage_ = Stage::kMaskedUpload;
  return absl::OkStatus();
}

absl::Status ServerRound::MaskingStartFor(uint64_t client, v1::SecAggMaskingStart* start) {
  const auto it = clients_.find(client);
  if (it == clients_.end() || !it->second.alive || stage_ != Stage::kMaskedUpload) {
    return absl::FailedPreconditionError(fl::StrCat("no masking start for client ", client, " in round ", config_.round,
                                                    " at stage ", StageName(stage_)));
  }
  start->Clear();
  start->set_round(config_.round);
  // Only the senders still alive: exactly the partners every one of them masks with (symmetry of the graph).
  for (const v1::SecAggEncryptedShare& s : it->second.inbox) {
    if (clients_.at(s.sender()).alive) *start->add_shares() = s;
  }
  it->second.bytes[2].down += start->ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::OnMaskedChunk(const v1::SecAggMaskedChunk& chunk) {
  if (chunk.words().empty() || chunk.words().size() % sizeof(uint32_t) != 0) {
    absl::StatusOr<Client*> c = Sender(Stage::kMaskedUpload, chunk.round(), chunk.client_id(), "a masked chunk");
    if (!c.ok()) return c.status();
    return Refuse(SecurityEventKind::kWrongLength, chunk.client_id(),
                  fl::StrCat("client ", chunk.client_id(), "'s masked chunk at offset ", chunk.offset(), " has ",
                             chunk.words().size(), " bytes; chunks carry whole 4-byte words, at least one"));
  }
  std::vector<uint32_t> words(chunk.words().size() / sizeof(uint32_t));
  std::memcpy(words.data(), chunk.words().data(), chunk.words().size());
  if (absl::Status s = OnMaskedWords(chunk.round(), chunk.client_id(), chunk.offset(), words); !s.ok()) return s;
  // Count the message's framing too (OnMaskedWords counted the words).
  clients_.at(chunk.client_id()).bytes[2].up += chunk.ByteSizeLong() - chunk.words().size();
  return absl::OkStatus();
}

absl::Status ServerRound::OnMaskedWords(uint64_t round, uint64_t client, uint64_t offset,
                                        std::span<const uint32_t> words) {
  absl::StatusOr<Client*> c = Sender(Stage::kMaskedUpload, round, client, "a masked chunk");
  if (!c.ok()) return c.status();
  const uint64_t length = config_.dimension + 1;
  if (offset < (*c)->next_word) {
    return Refuse(SecurityEventKind::kDuplicate, client,
                  fl::StrCat("client ", client, "'s masked chunk at offset ", offset, " repeats words it sent (",
                             (*c)->next_word, " received); chunks are sent once, in order"));
  }
  if (offset > (*c)->next_word || words.empty() || words.size() > length - offset) {
    return Refuse(SecurityEventKind::kWrongLength, client,
                  fl::StrCat("client ", client, "'s masked chunk of ", words.size(), " words at offset ", offset,
                             ": the next chunk starts at word ", (*c)->next_word, " and the masked vector has ", length,
                             " words (the model's ", config_.dimension, " and the weight)"));
  }
  uint32_t* sum = sum_.data() + offset;
  for (size_t i = 0; i < words.size(); ++i) sum[i] += words[i];  // mod 2^32: the masks cancel in this ring
  (*c)->next_word += words.size();
  (*c)->bytes[2].up += words.size() * sizeof(uint32_t);
  return absl::OkStatus();
}

absl::Status ServerRound::CloseMaskedUpload() {
  if (absl::Status s = CloseStage(Stage::kMaskedUpload); !s.ok()) return s;
  const uint64_t length = config_.dimension + 1;
  for (auto& [id, c] : clients_) {
    if (!c.alive) continue;
    if (c.next_word == length) {
      survivors_.insert(id);
    } else if (c.next_word == 0) {
      c.alive = false;
      dropped_[2].push_back(id);
    } else {
      return Fail(SecurityEventKind::kIncompleteUpload,
                  fl::StrCat("client ", id, "'s masked upload stopped at word ", c.next_word, " of ", length,
                             "; its words are in the running sum and cannot be removed without revealing its "
                             "update"));
    }
  }
  if (survivors_.empty()) return Fail(SecurityEventKind::kTooFewSurvivors, "no client completed its masked upload");
  auto holders = [&](uint64_t owner) {
    size_t n = 0;
    for (uint64_t v : graph_.NeighbourhoodOf(owner)) n += survivors_.contains(v) ? 1 : 0;
    return n;
  };
  for (uint64_t u : survivors_) {
    if (holders(u) < graph_.threshold) {
      return Fail(SecurityEventKind::kTooFewSurvivors, fl::StrCat("client ", u, " has ", holders(u),
                                                                  " surviving neighbours (itself included) to hold its "
                                                                  "self-mask seed's shares; the threshold is ",
                                                                  graph_.threshold));
    }
  }
  for (uint64_t v : dropped_[2]) {
    if (holders(v) < graph_.threshold) {
      return Fail(SecurityEventKind::kTooFewSurvivors,
                  fl::StrCat("client ", v, " dropped after sharing keys and only ", holders(v),
                             " of its neighbours survive to reveal its mask key; the threshold is ", graph_.threshold));
    }
  }
  stage_ = Stage::kUnmask;
  return absl::OkStatus();
}

absl::Status ServerRound::UnmaskRequestFor(uint64_t client, v1::SecAggUnmaskRequest* request) {
  if (stage_ != Stage::kUnmask || !survivors_.contains(client)) {
    return absl::FailedPreconditionError(fl::StrCat("no unmask request for client ", client, " in round ",
                                                    config_.round, " at stage ", StageName(stage_)));
  }
  request->Clear();
  request->set_round(config_.round);
  for (uint64_t v : graph_.NeighbourhoodOf(client)) {
    if (survivors_.contains(v)) request->add_survivors(v);
    if (std::find(dropped_[2].begin(), dropped_[2].end(), v) != dropped_[2].end()) request->add_dropped(v);
  }
  clients_.at(client).bytes[3].down += request->ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::OnUnmaskResponse(const v1::SecAggUnmaskResponse& response) {
  absl::StatusOr<Client*> c = Sender(Stage::kUnmask, response.round(), response.client_id(), "an unmask response");
  if (!c.ok()) return c.status();
  const uint64_t id = response.client_id();
  if ((*c)->has_response) {
    return Refuse(SecurityEventKind::kDuplicate, id, fl::StrCat("client ", id, " sent its unmask response twice"));
  }
  v1::SecAggUnmaskRequest request;
  if (absl::Status s = UnmaskRequestFor(id, &request); !s.ok()) return s;
  (*c)->bytes[3].down -= request.ByteSizeLong();  // recomputed here, not sent again
  std::map<uint64_t, v1::SecAggSecret> expected;
  for (uint64_t v : request.survivors()) expected[v] = v1::SECAGG_SECRET_SELF_MASK_SEED;
  for (uint64_t v : request.dropped()) expected[v] = v1::SECAGG_SECRET_MASK_KEY;
  std::map<uint64_t, std::array<uint8_t, 1 + kKeyBytes>> revealed;
  for (const v1::SecAggRevealedShare& s : response.shares()) {
    const auto want = expected.find(s.owner());
    if (want == expected.end() || want->second != s.secret()) {
      return Refuse(SecurityEventKind::kProtocolViolation, id,
                    fl::StrCat("client ", id, " revealed secret ", v1::SecAggSecret_Name(s.secret()), " of client ",
                               s.owner(), ", which the unmask request did not ask it for"));
    }
    if (revealed.contains(s.owner())) {
      return Refuse(SecurityEventKind::kDuplicate, id,
                    fl::StrCat("client ", id, " revealed two shares of client ", s.owner()));
    }
    if (s.share().size() != 1 + kKeyBytes) {
      return Refuse(SecurityEventKind::kWrongLength, id,
                    fl::StrCat("client ", id, "'s share of client ", s.owner(), " has ", s.share().size(),
                               " bytes; expected ", 1 + kKeyBytes));
    }
    if (static_cast<uint8_t>(s.share()[0]) != XOf(s.owner(), id)) {
      return Refuse(SecurityEventKind::kProtocolViolation, id,
                    fl::StrCat("client ", id, "'s share of client ", s.owner(),
                               " is at x = ", static_cast<int>(static_cast<uint8_t>(s.share()[0])),
                               "; its place is x = ", static_cast<int>(XOf(s.owner(), id))));
    }
    std::array<uint8_t, 1 + kKeyBytes> bytes{};
    std::memcpy(bytes.data(), s.share().data(), bytes.size());
    revealed[s.owner()] = bytes;
  }
  if (revealed.size() != expected.size()) {
    return Refuse(
        SecurityEventKind::kWrongLength, id,
        fl::StrCat("client ", id, " revealed ", revealed.size(), " shares; the request asked for ", expected.size()));
  }
  (*c)->revealed = std::move(revealed);
  (*c)->has_response = true;
  (*c)->bytes[3].up += response.ByteSizeLong();
  return absl::OkStatus();
}

absl::Status ServerRound::CloseUnmask() {
  if (absl::Status s = CloseStage(Stage::kUnmask); !s.ok()) return s;
  // All secrets first, then the masks: a failure leaves no partly unmasked sum.
  auto reconstruct = [&](uint64_t owner, std::string_view what) -> absl::StatusOr<Key> {
    std::vector<Share> shares;
    for (uint64_t v : graph_.NeighbourhoodOf(owner)) {
      const Client& holder = clients_.at(v);
      if (!holder.has_response) continue;
      const auto it = holder.revealed.find(owner);
      if (it == holder.revealed.end()) continue;
      shares.push_back({it->second[0], std::vector<uint8_t>(it->second.begin() + 1, it->second.end())});
    }
    if (shares.size() < graph_.threshold) {
      return Fail(SecurityEventKind::kTooFewSurvivors,
                  fl::StrCat(shares.size(), " shares of client ", owner, "'s ", what, " arrived; the threshold is ",
                             graph_.threshold));
    }
    absl::StatusOr<std::vector<uint8_t>> secret = ShamirCombine(shares, graph_.threshold);
    if (!secret.ok()) {
      return Fail(SecurityEventKind::kProtocolViolation,
                  fl::StrCat("the shares of client ", owner, "'s ", what, ": ", fl::ToStd(secret.status().message())));
    }
    Key key{};
    std::memcpy(key.data(), secret->data(), kKeyBytes);
    Wipe(*secret);
    return key;
  };
  std::vector<Key> seeds;
  for (uint64_t u : survivors_) {
    absl::StatusOr<Key> b = reconstruct(u, "self-mask seed");
    if (!b.ok()) return b.status();
    seeds.push_back(RoundMaskKey(*b, config_.round));
    reconstructed_.push_back({u, v1::SECAGG_SECRET_SELF_MASK_SEED});
  }
  struct PairMask {
    Key key;
    int sign;  // what removes it from the sum
  };
  std::vector<PairMask> pairs;
  for (uint64_t v : dropped_[2]) {
    absl::StatusOr<Key> secret = reconstruct(v, "mask key");
    if (!secret.ok()) return secret.status();
    const Client& dropped = clients_.at(v);
    if (PublicKeyOf(*secret) != dropped.mask_public) {
      return Fail(SecurityEventKind::kProtocolViolation,
                  fl::StrCat("client ", v, "'s reconstructed mask key does not match the public key it advertised"));
    }
    reconstructed_.push_back({v, v1::SECAGG_SECRET_MASK_KEY});
    for (uint64_t u : graph_.NeighbourhoodOf(v)) {
      if (!survivors_.contains(u)) continue;
      absl::StatusOr<Key> agreed =
          AgreeKey(KeyPurpose::kMask, *secret, dropped.mask_public, clients_.at(u).mask_public);
      if (!agreed.ok()) return Fail(SecurityEventKind::kBadKey, fl::ToStd(agreed.status().message()));
      // u added +PRG(s_uv) when v > u, -PRG(s_uv) when v < u (client_round.cc); the opposite removes it.
      pairs.push_back({RoundMaskKey(*agreed, config_.round), v > u ? -1 : +1});
    }
    Key wipe = *secret;
    Wipe(wipe);
  }
  std::vector<SignedKey> masks;
  for (Key& key : seeds) {
    masks.push_back({key, -1});
    Wipe(key);
  }
  for (PairMask& p : pairs) {
    masks.push_back({p.key, p.sign});
    Wipe(p.key);
  }
  ApplyMasks(masks, 0, sum_);
  for (SignedKey& m : masks) Wipe(m.key);
  stage_ = Stage::kDone;
  return absl::OkStatus();
}

absl::StatusOr<AggregateResult> ServerRound::Result() const {
  if (stage_ != Stage::kDone) {
    return absl::FailedPreconditionError(
        stage_ == Stage::kFailed ? failure_
                                 : fl::StrCat("round ", config_.round, "'s secure aggregation is at stage ",
                                              StageName(stage_), "; the result comes after the unmask stage"));
  }
  AggregateResult r;
  r.total_weight = sum_[config_.dimension];
  r.survivors.assign(survivors_.begin(), survivors_.end());
  if (r.total_weight == 0 || r.total_weight > uint64_t{1} << 31) {
    return absl::InternalError(fl::StrCat("the unmasked total weight is ", r.total_weight,
                                          "; a client's masks did not cancel (a bug or a lying client)"));
  }
  const double denominator = config_.quantization.scale * static_cast<double>(r.total_weight);
  r.mean.resize(config_.dimension);
  for (uint64_t i = 0; i < config_.dimension; ++i) {
    r.mean[i] = static_cast<float>(static_cast<double>(static_cast<int32_t>(sum_[i])) / denominator);
  }
  return r;
}

}  // namespace fl::secagg

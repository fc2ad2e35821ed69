// Every bad input of the list, refused with an error naming the value, carrying its security-event
// kind, and recorded by the server: a threshold above the neighbours, a population beyond the quantisation
// range, keys / shares / masked chunks / unmask answers from a client not in the round, for another round,
// duplicated, of the wrong length or failing authentication; a request to reveal both secrets of one client;
// an upload that stops part way.
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "round_harness.h"

namespace fl::secagg {
namespace {

using testing::RoundHarness;

#define EXPECT_REFUSED(expr, kind, text)                                           \
  do {                                                                             \
    const absl::Status refused_ = (expr);                                          \
    EXPECT_EQ(SecurityEventOf(refused_), (kind)) << refused_;                      \
    EXPECT_NE(refused_.message().find(text), absl::string_view::npos) << refused_; \
  } while (0)

const QuantizationSpec kSpec{1.0, 65536.0, 1};

// A copy of `message` from client 999 (not in the round) and one of round 6 (this is round 7), each refused.
template <typename Message, typename Deliver>
void ExpectOutsiderAndOldRoundRefused(const Message& message, Deliver deliver) {
  Message stranger = message;
  stranger.set_client_id(999);
  EXPECT_REFUSED(deliver(stranger), SecurityEventKind::kNotInRound, "client 999");
  Message old = message;
  old.set_round(6);
  EXPECT_REFUSED(deliver(old), SecurityEventKind::kWrongRound, "round 6");
}

TEST(SecAggBadInputTest, ThresholdAboveTheNeighboursIsRefusedAtCreation) {
  ServerRoundConfig config;
  config.round = 1;
  config.dimension = 10;
  for (uint64_t i = 1; i <= 5; ++i) config.participants.push_back(i);
  config.graph.threshold = 6;
  auto server = ServerRound::Create(config, RandomSource::SeededForTests(1));
  EXPECT_REFUSED(server.status(), SecurityEventKind::kThresholdAboveNeighbours, "threshold 6");
  // And a client given such a setup refuses it too.
  v1::SecAggSetup setup;
  setup.set_round(1);
  setup.set_client_id(1);
  for (uint64_t i = 1; i <= 5; ++i) setup.add_neighbours(i);
  setup.set_threshold(6);
  setup.set_dimension(10);
  setup.mutable_quantization()->set_range(1);
  setup.mutable_quantization()->set_scale(65536);
  setup.mutable_quantization()->set_max_weight(1);
  v1::SecAggPublicKeys keys;
  EXPECT_REFUSED(ClientRound::Start(setup, RandomSource::SeededForTests(1), &keys).status(),
                 SecurityEventKind::kThresholdAboveNeighbours, "threshold 6");
}

TEST(SecAggBadInputTest, APopulationBeyondTheQuantisationRangeIsRefused) {
  ServerRoundConfig config;
  config.round = 1;
  config.dimension = 10;
  config.quantization = {1.0, 1u << 20, 1000};  // at most floor((2^31 - 1) / 2^20 / 1000) = 2 clients
  for (uint64_t i = 1; i <= 3; ++i) config.participants.push_back(i);
  EXPECT_REFUSED(ServerRound::Create(config, RandomSource::SeededForTests(1)).status(),
                 SecurityEventKind::kPopulationBeyondRange, "3 clients");
  config.participants.pop_back();
  EXPECT_TRUE(ServerRound::Create(config, RandomSource::SeededForTests(1)).ok());
}

TEST(SecAggBadInputTest, KeysFromOutsideTheRoundAnotherRoundTwiceOrOfTheWrongLength) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 11);
  v1::SecAggSetup setup;
  ASSERT_TRUE(h.server->SetupFor(100, &setup).ok());
  v1::SecAggPublicKeys keys;
  auto client = ClientRound::Start(setup, RandomSource::SeededForTests(5), &keys);
  ASSERT_TRUE(client.ok());
  ExpectOutsiderAndOldRoundRefused(keys, [&](const v1::SecAggPublicKeys& m) { return h.server->OnPublicKeys(m); });
  v1::SecAggPublicKeys short_key = keys;
  short_key.mutable_mask_public_key()->pop_back();
  EXPECT_REFUSED(h.server->OnPublicKeys(short_key), SecurityEventKind::kWrongLength, "31 bytes");
  ASSERT_TRUE(h.server->OnPublicKeys(keys).ok());
  EXPECT_REFUSED(h.server->OnPublicKeys(keys), SecurityEventKind::kDuplicate, "twice");
  v1::SecAggPublicKeys copycat = keys;  // another client replaying 100's keys
  copycat.set_client_id(103);
  EXPECT_REFUSED(h.server->OnPublicKeys(copycat), SecurityEventKind::kBadKey, "of client 100");
  // Every refusal is on the record with its client.
  ASSERT_EQ(h.server->events().size(), 5u);
  EXPECT_EQ(h.server->events()[0].client_id, 999u);
  EXPECT_EQ(h.server->events()[4].kind, SecurityEventKind::kBadKey);
}

TEST(SecAggBadInputTest, ClientRefusesNeighbourKeysItCannotTrust) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 12);
  h.Advertise();
  v1::SecAggNeighbourKeys keys;
  ASSERT_TRUE(h.server->NeighbourKeysFor(100, &keys).ok());
  v1::SecAggShares shares;
  v1::SecAggNeighbourKeys wrong_round = keys;
  wrong_round.set_round(8);
  EXPECT_REFUSED(h.clients[100]->OnNeighbourKeys(wrong_round, &shares), SecurityEventKind::kWrongRound, "round 8");
  v1::SecAggNeighbourKeys stranger = keys;
  stranger.mutable_neighbours(1)->set_client_id(555);
  EXPECT_REFUSED(h.clients[100]->OnNeighbourKeys(stranger, &shares), SecurityEventKind::kNotInRound, "555");
  v1::SecAggNeighbourKeys twice = keys;
  *twice.add_neighbours() = keys.neighbours(2);
  EXPECT_REFUSED(h.clients[100]->OnNeighbourKeys(twice, &shares), SecurityEventKind::kDuplicate, "appear twice");
  v1::SecAggNeighbourKeys same_key = keys;
  same_key.mutable_neighbours(2)->set_mask_public_key(keys.neighbours(3).mask_public_key());
  EXPECT_REFUSED(h.clients[100]->OnNeighbourKeys(same_key, &shares), SecurityEventKind::kBadKey, "equal");
  v1::SecAggNeighbourKeys few = keys;
  few.mutable_neighbours()->DeleteSubrange(2, 3);  // 2 of 5 left, t = 3
  EXPECT_REFUSED(h.clients[100]->OnNeighbourKeys(few, &shares), SecurityEventKind::kTooFewSurvivors, "only 2");
  EXPECT_TRUE(h.clients[100]->OnNeighbourKeys(keys, &shares).ok());  // nothing refused changed its state
}

TEST(SecAggBadInputTest, SharesFromOutsideTwiceOfTheWrongLengthOrFailingAuthentication) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 13);
  h.Advertise();
  std::map<uint64_t, v1::SecAggShares> sent;
  for (uint64_t id : h.config.participants) {
    v1::SecAggNeighbourKeys keys;
    ASSERT_TRUE(h.server->NeighbourKeysFor(id, &keys).ok());
    ASSERT_TRUE(h.clients[id]->OnNeighbourKeys(keys, &sent[id]).ok());
  }
  ExpectOutsiderAndOldRoundRefused(sent[100], [&](const v1::SecAggShares& m) { return h.server->OnShares(m); });
  v1::SecAggShares cut = sent[100];
  cut.mutable_shares(0)->mutable_ciphertext()->pop_back();
  EXPECT_REFUSED(h.server->OnShares(cut), SecurityEventKind::kWrongLength, "80-byte ciphertext");
  v1::SecAggShares missing = sent[100];
  missing.mutable_shares()->RemoveLast();
  EXPECT_REFUSED(h.server->OnShares(missing), SecurityEventKind::kWrongLength, "sent 3 shares");
  v1::SecAggShares doubled = sent[100];
  *doubled.mutable_shares(1) = doubled.shares(0);
  EXPECT_REFUSED(h.server->OnShares(doubled), SecurityEventKind::kDuplicate, "two shares");
  for (auto& [id, s] : sent) ASSERT_TRUE(h.server->OnShares(s).ok());
  EXPECT_REFUSED(h.server->OnShares(sent[100]), SecurityEventKind::kDuplicate, "twice");
  ASSERT_TRUE(h.server->CloseShareKeys().ok());

  // At the receiver: an altered share, one claimed by another sender, one of another round.
  v1::SecAggMaskingStart start;
  ASSERT_TRUE(h.server->MaskingStartFor(103, &start).ok());
  v1::SecAggMaskingStart altered = start;
  (*altered.mutable_shares(0)->mutable_ciphertext())[5] ^= 1;
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(altered, 1), SecurityEventKind::kAuthenticationFailed,
                 "failed authentication");
  // The first share presented as coming from the last sender (whose own share is left out): the key and the
  // associated data of that pair do not open it.
  v1::SecAggMaskingStart relabelled = start;
  const uint64_t other_sender = relabelled.shares(relabelled.shares_size() - 1).sender();
  relabelled.mutable_shares()->RemoveLast();
  relabelled.mutable_shares(0)->set_sender(other_sender);
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(relabelled, 1), SecurityEventKind::kAuthenticationFailed,
                 fl::StrCat("from client ", other_sender));
  v1::SecAggMaskingStart for_other = start;
  for_other.mutable_shares(0)->set_receiver(106);
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(for_other, 1), SecurityEventKind::kNotInRound, "reached client 103");
  v1::SecAggMaskingStart doubled_start = start;
  *doubled_start.add_shares() = start.shares(0);
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(doubled_start, 1), SecurityEventKind::kDuplicate, "two shares");
  v1::SecAggMaskingStart old_start = start;
  old_start.set_round(6);
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(old_start, 1), SecurityEventKind::kWrongRound, "round 6");
  EXPECT_REFUSED(h.clients[103]->OnMaskingStart(start, 2), SecurityEventKind::kInvalidInput, "weight 2");
  EXPECT_TRUE(h.clients[103]->OnMaskingStart(start, 1).ok());
}

TEST(SecAggBadInputTest, SharesSealedForAnotherRoundFailAuthentication) {
  // The same clients' keys, but the share sealed in round 7 replayed into a masking start of round 8: the
  // round is in the associated data.
  RandomSource random = RandomSource::SeededForTests(3);
  const KeyPair a = NewKeyPair(random), b = NewKeyPair(random);
  const Key key = *AgreeKey(KeyPurpose::kShareEncryption, a.secret_key, a.public_key, b.public_key);
  const std::vector<uint8_t> text(65, 1);
  auto [nonce, ciphertext] = Seal(key, ShareAssociatedData(7, 1, 2), text, random);
  EXPECT_EQ(SecurityEventOf(Open(key, ShareAssociatedData(8, 1, 2), nonce, ciphertext).status()),
            SecurityEventKind::kAuthenticationFailed);
}

TEST(SecAggBadInputTest, MaskedChunksFromOutsideAnotherRoundDuplicatedOrOfTheWrongLength) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 14);
  h.Advertise();
  h.Share();
  v1::SecAggMaskingStart start;
  ASSERT_TRUE(h.server->MaskingStartFor(100, &start).ok());
  ASSERT_TRUE(h.clients[100]->OnMaskingStart(start, 1).ok());
  const std::vector<float> x(10, 0.25f);
  v1::SecAggMaskedChunk chunk;
  ASSERT_TRUE(h.clients[100]->MaskChunk(0, std::span<const float>(x).subspan(0, 6), &chunk).ok());
  ExpectOutsiderAndOldRoundRefused(chunk, [&](const v1::SecAggMaskedChunk& m) { return h.server->OnMaskedChunk(m); });
  v1::SecAggMaskedChunk ragged = chunk;
  ragged.mutable_words()->pop_back();
  EXPECT_REFUSED(h.server->OnMaskedChunk(ragged), SecurityEventKind::kWrongLength, "23 bytes");
  v1::SecAggMaskedChunk gap = chunk;
  gap.set_offset(2);
  EXPECT_REFUSED(h.server->OnMaskedChunk(gap), SecurityEventKind::kWrongLength, "starts at word 0");
  ASSERT_TRUE(h.server->OnMaskedChunk(chunk).ok());
  EXPECT_REFUSED(h.server->OnMaskedChunk(chunk), SecurityEventKind::kDuplicate, "repeats words");
  v1::SecAggMaskedChunk rest;
  ASSERT_TRUE(h.clients[100]->MaskChunk(6, std::span<const float>(x).subspan(6), &rest).ok());
  v1::SecAggMaskedChunk too_long = rest;
  too_long.mutable_words()->append(8, '\0');  // past the weight word
  EXPECT_REFUSED(h.server->OnMaskedChunk(too_long), SecurityEventKind::kWrongLength, "has 11 words");
  // The client refuses to mask past the model or a non-finite value.
  EXPECT_REFUSED(h.clients[100]->MaskChunk(8, std::span<const float>(x).subspan(0, 3), &rest),
                 SecurityEventKind::kWrongLength, "offset 8");
  const std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_REFUSED(h.clients[100]->MaskChunk(0, nan, &rest), SecurityEventKind::kInvalidInput, "coordinate 1");
  EXPECT_EQ(h.server->events().size(), 6u);  // the server's six refusals, each recorded
}

TEST(SecAggBadInputTest, AnUploadThatStopsPartWayFailsTheRound) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 15);
  h.Advertise();
  h.Share();
  v1::SecAggMaskingStart start;
  ASSERT_TRUE(h.server->MaskingStartFor(100, &start).ok());
  ASSERT_TRUE(h.clients[100]->OnMaskingStart(start, 1).ok());
  const std::vector<float> x(4, 0.5f);
  v1::SecAggMaskedChunk chunk;
  ASSERT_TRUE(h.clients[100]->MaskChunk(0, x, &chunk).ok());
  ASSERT_TRUE(h.server->OnMaskedChunk(chunk).ok());
  EXPECT_REFUSED(h.server->CloseMaskedUpload(), SecurityEventKind::kIncompleteUpload, "stopped at word 4 of 11");
  EXPECT_EQ(h.server->stage(), Stage::kFailed);
}

TEST(SecAggBadInputTest, NoClientRevealsBothSecretsOfOneClient) {
  RoundHarness h = RoundHarness::Make(6, 10, kSpec, 16);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({112}).ok());
  v1::SecAggUnmaskRequest request;
  ASSERT_TRUE(h.server->UnmaskRequestFor(100, &request).ok());
  v1::SecAggUnmaskResponse response;
  // A (dishonest) server asking for 103's seed and its mask key at once.
  v1::SecAggUnmaskRequest both = request;
  both.add_dropped(103);
  EXPECT_REFUSED(h.clients[100]->OnUnmaskRequest(both, &response), SecurityEventKind::kProtocolViolation,
                 "client 103 twice");
  v1::SecAggUnmaskRequest own_key = request;
  own_key.clear_survivors();
  own_key.add_dropped(100);
  EXPECT_REFUSED(h.clients[100]->OnUnmaskRequest(own_key, &response), SecurityEventKind::kProtocolViolation,
                 "own mask key");
  v1::SecAggUnmaskRequest stranger = request;
  stranger.add_dropped(999);
  EXPECT_REFUSED(h.clients[100]->OnUnmaskRequest(stranger, &response), SecurityEventKind::kNotInRound, "999");
  v1::SecAggUnmaskRequest old = request;
  old.set_round(2);
  EXPECT_REFUSED(h.clients[100]->OnUnmaskRequest(old, &response), SecurityEventKind::kWrongRound, "round 2");
  ASSERT_TRUE(h.clients[100]->OnUnmaskRequest(request, &response).ok());
  // Asked again, with 112 now claimed a survivor: once per round.
  v1::SecAggUnmaskRequest again = request;
  again.clear_dropped();
  again.add_survivors(112);
  EXPECT_REFUSED(h.clients[100]->OnUnmaskRequest(again, &response), SecurityEventKind::kDuplicate, "second");

  // The server side of the unmask stage.
  v1::SecAggUnmaskResponse wrong_kind = response;
  wrong_kind.mutable_shares(0)->set_secret(v1::SECAGG_SECRET_MASK_KEY);
  EXPECT_REFUSED(h.server->OnUnmaskResponse(wrong_kind), SecurityEventKind::kProtocolViolation, "did not ask");
  v1::SecAggUnmaskResponse cut = response;
  cut.mutable_shares(0)->mutable_share()->pop_back();
  EXPECT_REFUSED(h.server->OnUnmaskResponse(cut), SecurityEventKind::kWrongLength, "32 bytes");
  v1::SecAggUnmaskResponse short_answer = response;
  short_answer.mutable_shares()->RemoveLast();
  EXPECT_REFUSED(h.server->OnUnmaskResponse(short_answer), SecurityEventKind::kWrongLength, "revealed 5 shares");
  v1::SecAggUnmaskResponse from_dropped = response;
  from_dropped.set_client_id(112);
  EXPECT_REFUSED(h.server->OnUnmaskResponse(from_dropped), SecurityEventKind::kNotInRound, "dropped");
  ASSERT_TRUE(h.server->OnUnmaskResponse(response).ok());
  EXPECT_REFUSED(h.server->OnUnmaskResponse(response), SecurityEventKind::kDuplicate, "twice");
}

TEST(SecAggBadInputTest, AFloodOfRefusedMessagesIsCountedNotKept) {
  RoundHarness h = RoundHarness::Make(3, 10, kSpec, 18);
  v1::SecAggPublicKeys stranger;
  stranger.set_round(7);
  stranger.set_client_id(999);
  for (size_t i = 0; i < ServerRound::kMaxEvents + 10; ++i) EXPECT_FALSE(h.server->OnPublicKeys(stranger).ok());
  EXPECT_EQ(h.server->events().size(), ServerRound::kMaxEvents);
  EXPECT_EQ(h.server->events_not_kept(), 10u);
}

TEST(SecAggBadInputTest, MessagesOutOfStageAreRefused) {
  RoundHarness h = RoundHarness::Make(5, 10, kSpec, 17);
  h.Advertise();
  v1::SecAggPublicKeys late;
  late.set_round(7);
  late.set_client_id(100);
  EXPECT_REFUSED(h.server->OnPublicKeys(late), SecurityEventKind::kProtocolViolation, "stage share_keys");
  EXPECT_FALSE(h.server->CloseMaskedUpload().ok());
}

}  // namespace
}  // namespace fl::secagg

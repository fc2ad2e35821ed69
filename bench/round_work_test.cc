// The raw-TCP reference's round work (round_work.h) driven without sockets: it must do the round's real work —
// the new global model is the FedAvg of what the clients trained, published as fl-server publishes it — and its
// checks must catch what they are there for (a corrupted download or upload). Then the exchange itself
// (raw_tcp_round.h) over loopback, with and without the work.
#include "round_work.h"

#include "raw_tcp_round.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "fl/client/synthetic_trainer.h"
#include "fl/core/checksum.h"
#include "fl/core/codec.h"

namespace fl::bench {
namespace {

constexpr int kClients = 3;
constexpr uint64_t kParams = 3000;

// Client i receives the download in two parts, as the exchange delivers it.
absl::StatusOr<std::vector<uint8_t>> Download(NecessaryWork& work, int i) {
  const std::span<const uint8_t> sent = work.ServerDownload();
  const std::span<uint8_t> into = work.ClientDownloadBuffer(i);
  EXPECT_EQ(into.size(), sent.size());
  std::memcpy(into.data(), sent.data(), sent.size());
  const size_t half = sent.size() / 2;
  work.ClientReceived(i, into.first(half));
  work.ClientReceived(i, into.subspan(half));
  auto upload = work.ClientUpload(i);
  if (!upload.ok()) return upload.status();
  return std::vector<uint8_t>(upload->begin(), upload->end());
}

absl::Status Upload(NecessaryWork& work, int i, const std::vector<uint8_t>& upload) {
  const std::span<uint8_t> into = work.ServerUploadBuffer(i);
  EXPECT_EQ(into.size(), upload.size());
  std::memcpy(into.data(), upload.data(), upload.size());
  work.ServerReceived(i, into);
  return work.ServerUploadDone(i);
}

std::vector<float> Values(std::span<const uint8_t> payload) {
  auto codec = core::MakeCodec(core::CodecKind::kFp32);
  std::vector<float> out((payload.size() - core::kCodecHeaderBytes) / sizeof(float));
  EXPECT_TRUE((*codec)->Decode(payload, out).ok());
  return out;
}

TEST(RoundWorkTest, ARoundPublishesTheFedAvgOfWhatTheClientsTrained) {
  auto work = NecessaryWork::Create(kClients, kParams);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ((*work)->payload_bytes(), core::kCodecHeaderBytes + 4 * kParams);
  const std::vector<float> global = Values((*work)->ServerDownload());
  ASSERT_EQ(global.size(), kParams);

  std::vector<double> mean(kParams, 0.0);
  for (int i = 0; i < kClients; ++i) {
    auto upload = Download(**work, i);
    ASSERT_TRUE(upload.ok()) << upload.status();
    // The upload is the pseudo-gradient global - local, without a body checksum (the transfer's XXH3 covers it).
    auto codec = core::MakeCodec(core::CodecKind::kFp32);
    std::vector<float> update(kParams);
    EXPECT_FALSE((*codec)->Decode(*upload, update).ok()) << "an upload must carry no body checksum";
    ASSERT_TRUE((*codec)->Decode(*upload, update, {.transfer_verified = true}).ok());
    for (size_t k = 0; k < kParams; ++k) mean[k] += (global[k] - update[k]) / kClients;
    ASSERT_TRUE(Upload(**work, i, *upload).ok());
  }
  ASSERT_TRUE((*work)->ServerFinish().ok());

  // Published with its body checksum, as fl-server publishes a model: a plain Decode accepts it.
  const std::vector<float> next = Values((*work)->ServerDownload());
  ASSERT_EQ(next.size(), kParams);
  size_t moved = 0;
  for (size_t k = 0; k < kParams; ++k) {
    EXPECT_NEAR(next[k], mean[k], 1e-6) << "parameter " << k;
    moved += next[k] != global[k];
  }
  EXPECT_GT(moved, kParams / 2) << "training moved the model";
}

TEST(RoundWorkTest, ACorruptedDownloadIsRefusedByTheClient) {
  auto work = NecessaryWork::Create(1, kParams);
  ASSERT_TRUE(work.ok()) << work.status();
  const std::span<const uint8_t> sent = (*work)->ServerDownload();
  const std::span<uint8_t> into = (*work)->ClientDownloadBuffer(0);
  std::memcpy(into.data(), sent.data(), sent.size());
  into[sent.size() - 3] ^= 0x10;
  (*work)->ClientReceived(0, into);
  auto upload = (*work)->ClientUpload(0);
  ASSERT_FALSE(upload.ok());
  EXPECT_EQ(upload.status().code(), absl::StatusCode::kDataLoss) << upload.status();
}

TEST(RoundWorkTest, ACorruptedUploadIsRefusedByTheServerAndNotAggregated) {
  auto work = NecessaryWork::Create(2, kParams);
  ASSERT_TRUE(work.ok()) << work.status();
  auto first = Download(**work, 0);
  auto second = Download(**work, 1);
  ASSERT_TRUE(first.ok() && second.ok());
  std::vector<uint8_t> corrupted = *second;
  corrupted[core::kCodecHeaderBytes + 5] ^= 0x01;
  const absl::Status refused = Upload(**work, 1, corrupted);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  ASSERT_TRUE(Upload(**work, 0, *first).ok());
  ASSERT_TRUE((*work)->ServerFinish().ok());
  // Only client 0's update made the round: the new model is its trained model.
  auto codec = core::MakeCodec(core::CodecKind::kFp32);
  std::vector<float> update(kParams);
  ASSERT_TRUE((*codec)->Decode(*first, update, {.transfer_verified = true}).ok());
  const std::vector<float> next = Values((*work)->ServerDownload());
  std::vector<float> global(kParams);
  client::SyntheticTrainer initial(kParams, 1, /*seed=*/1);
  ASSERT_TRUE(initial.GetParameters(global).ok());
  for (size_t k = 0; k < kParams; ++k) EXPECT_NEAR(next[k], global[k] - update[k], 1e-6) << "parameter " << k;
}

TEST(RawTcpRoundTest, MovesTheBytesOfKClientsOverLoopback) {
  auto seconds = RawTcpRound(4, 1 << 20, 1 << 20);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0);
}

// Over loopback the exchange drives every hook of the work: two rounds publish the same models (up to the order of
// the sum) as two rounds of an identical work driven in this process (ARoundPublishesTheFedAvgOfWhatTheClientsTrained
// checks those).
TEST(RawTcpRoundTest, WithTheWorkItPublishesWhatTheWorkDrivenInProcessPublishes) {
  auto over_tcp = NecessaryWork::Create(kClients, kParams);
  auto in_process = NecessaryWork::Create(kClients, kParams);
  ASSERT_TRUE(over_tcp.ok() && in_process.ok());
  const std::vector<float> initial = Values((*over_tcp)->ServerDownload());
  const uint64_t bytes = (*over_tcp)->payload_bytes();
  for (int round = 1; round <= 2; ++round) {
    auto seconds = RawTcpRound(kClients, bytes, bytes, over_tcp->get());
    ASSERT_TRUE(seconds.ok()) << "round " << round << ": " << seconds.status();
    for (int i = 0; i < kClients; ++i) {
      auto upload = Download(**in_process, i);
      ASSERT_TRUE(upload.ok()) << upload.status();
      ASSERT_TRUE(Upload(**in_process, i, *upload).ok());
    }
    ASSERT_TRUE((*in_process)->ServerFinish().ok());
    // Equal up to the order of the sum: the uploads reach the aggregator in the order they arrive.
    const std::vector<float> a = Values((*over_tcp)->ServerDownload()), b = Values((*in_process)->ServerDownload());
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], 1e-6) << "round " << round << ", parameter " << k;
  }
  EXPECT_NE(Values((*over_tcp)->ServerDownload()), initial);
}

TEST(RoundWorkTest, NoClientsOrNoParametersIsRefused) {
  EXPECT_EQ(NecessaryWork::Create(0, kParams).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NecessaryWork::Create(2, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fl::bench

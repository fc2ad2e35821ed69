// SecAgg+ (secagg/) per coordinate, against memcpy of the same bytes in the same run: the client masking its
// 1M-coordinate update (quantise, weight, add the self mask and one ChaCha20 mask per neighbour), the server
// summing K masked uploads as they stream in, and the server unmasking the round (one keystream per survivor's
// self mask, one per (dropped client, surviving neighbour) pair), at K = 10, 50, 100 clients per round (the
// neighbourhood k: 10 (full graph), 17, 21). Stages 1-2 (keys, shares) are run for real before each timed
// region, outside it; their cost is in the counters' bytes, not in the rates.
//
// Bytes per client and stage come from the ServerRound's own accounting (serialized messages; the upload at
// 4 bytes a word plus the framing of 64K-word chunks) and are printed as counters beside plain fp32 FedAvg
// (4n bytes down + 4n up): `vs_fedavg` is (4n model download + every SecAgg+ message) / 8n.
//   cmake --build build/release --target secagg_bench && build/release/bench/secagg_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "fl/secagg/client_round.h"
#include "fl/secagg/server_round.h"
#include "ratio_reporter.h"

namespace {

using fl::secagg::ClientRound;
using fl::secagg::RandomSource;
using fl::secagg::ServerRound;

constexpr int64_t kCoordinates = 1 << 20;
constexpr size_t kChunkWords = 1 << 16;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "secagg_bench: %s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

// A round of `k` clients (ids 1..k) after the share-keys stage, every client at its masking start.
struct Round {
  std::unique_ptr<ServerRound> server;
  std::map<uint64_t, std::unique_ptr<ClientRound>> clients;

  Round(size_t k, uint64_t dimension, uint64_t seed) {
    fl::secagg::ServerRoundConfig config;
    config.round = 1;
    config.dimension = dimension;
    for (uint64_t id = 1; id <= k; ++id) config.participants.push_back(id);
    auto s = ServerRound::Create(config, RandomSource::SeededForTests(seed));
    Check(s.status());
    server = *std::move(s);
    for (uint64_t id : config.participants) {
      fl::v1::SecAggSetup setup;
      Check(server->SetupFor(id, &setup));
      fl::v1::SecAggPublicKeys keys;
      auto c = ClientRound::Start(setup, RandomSource::System(), &keys);
      Check(c.status());
      clients[id] = *std::move(c);
      Check(server->OnPublicKeys(keys));
    }
    Check(server->CloseAdvertiseKeys());
    for (uint64_t id : config.participants) {
      fl::v1::SecAggNeighbourKeys keys;
      Check(server->NeighbourKeysFor(id, &keys));
      fl::v1::SecAggShares shares;
      Check(clients[id]->OnNeighbourKeys(keys, &shares));
      Check(server->OnShares(shares));
    }
    Check(server->CloseShareKeys());
    for (uint64_t id : config.participants) {
      fl::v1::SecAggMaskingStart start;
      Check(server->MaskingStartFor(id, &start));
      Check(clients[id]->OnMaskingStart(start, 1));
    }
  }

  // Uploads `words` as every client's masked vector except `absent`'s, in chunks (what the server does per
  // streamed chunk is the same whatever the words are).
  void Upload(const std::vector<uint32_t>& words, const std::set<uint64_t>& absent) {
    for (const auto& [id, c] : clients) {
      if (absent.contains(id)) continue;
      for (size_t off = 0; off < words.size(); off += kChunkWords) {
        const size_t n = std::min(kChunkWords, words.size() - off);
        Check(server->OnMaskedWords(1, id, off, std::span<const uint32_t>(words).subspan(off, n)));
      }
    }
  }
};

std::vector<float> Update(size_t n) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  fl::bench::MemcpyReference(state, Update(static_cast<size_t>(state.range(0))));
}

// One client masks its whole update (bytes: its 4n).
void BM_ClientMask(benchmark::State& state) {
  const size_t k = static_cast<size_t>(state.range(0));
  const size_t n = static_cast<size_t>(state.range(1));
  Round round(k, n, 1);
  ClientRound& client = *round.clients.begin()->second;
  const std::vector<float> x = Update(n);
  std::vector<uint32_t> words(n);
  for (auto _ : state) {
    Check(client.MaskChunk(0, x, std::span<uint32_t>(words)));
    benchmark::DoNotOptimize(words.data());
    benchmark::ClobberMemory();
  }
  state.counters["masks"] = static_cast<double>(client.mask_partners() + 1);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}

// The server adds every client's masked upload to the running sum, chunk by chunk (bytes: K * 4(n + 1)), and
// the bytes per client and stage of the round.
void BM_ServerSum(benchmark::State& state) {
  const size_t k = static_cast<size_t>(state.range(0));
  const size_t n = static_cast<size_t>(state.range(1));
  const std::vector<uint32_t> words(n + 1, 0x9e3779b9u);
  std::unique_ptr<Round> round;
  for (auto _ : state) {
    state.PauseTiming();
    round = std::make_unique<Round>(k, n, 2);
    state.ResumeTiming();
    round->Upload(words, {});
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(k * (n + 1) * 4));
  // The round's bytes for client 1, after the unmask stage (also outside the timing).
  Check(round->server->CloseMaskedUpload());
  for (const auto& [id, c] : round->clients) {
    fl::v1::SecAggUnmaskRequest request;
    Check(round->server->UnmaskRequestFor(id, &request));
    fl::v1::SecAggUnmaskResponse response;
    Check(c->OnUnmaskRequest(request, &response));
    Check(round->server->OnUnmaskResponse(response));
  }
  const auto bytes = round->server->BytesOf(1);
  const double chunks = static_cast<double>((n + 1 + kChunkWords - 1) / kChunkWords);
  const double stage_bytes[4] = {static_cast<double>(bytes[0].down + bytes[0].up),
                                 static_cast<double>(bytes[1].down + bytes[1].up),
                                 static_cast<double>(bytes[2].down + bytes[2].up) + chunks * 16,  // chunk framing
                                 static_cast<double>(bytes[3].down + bytes[3].up)};
  state.counters["adv_B"] = stage_bytes[0];
  state.counters["share_B"] = stage_bytes[1];
  state.counters["upload_B"] = stage_bytes[2];
  state.counters["unmask_B"] = stage_bytes[3];
  const double plain = 8.0 * static_cast<double>(n);  // fp32 FedAvg: 4n down, 4n up
  state.counters["vs_fedavg"] =
      (4.0 * static_cast<double>(n) + stage_bytes[0] + stage_bytes[1] + stage_bytes[2] + stage_bytes[3]) / plain;
}

// The server unmasks the round with `drop_pct` percent of the clients dropped after sharing keys (bytes: the
// 4(n + 1) of the sum it unmasks).
void BM_ServerUnmask(benchmark::State& state) {
  const size_t k = static_cast<size_t>(state.range(0));
  const size_t drop_pct = static_cast<size_t>(state.range(1));
  const size_t n = static_cast<size_t>(state.range(2));
  const std::vector<uint32_t> words(n + 1, 0);
  std::set<uint64_t> absent;
  for (uint64_t id = 1; id <= k; ++id) {
    if ((id - 1) % 10 < drop_pct / 10) absent.insert(id);  // 10%: ids 1, 11, 21, ...; 30%: 1-3, 11-13, ...
  }
  double keystreams = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Round round(k, n, 3);
    round.Upload(words, absent);
    Check(round.server->CloseMaskedUpload());
    for (const auto& [id, c] : round.clients) {
      if (absent.contains(id)) continue;
      fl::v1::SecAggUnmaskRequest request;
      Check(round.server->UnmaskRequestFor(id, &request));
      fl::v1::SecAggUnmaskResponse response;
      Check(c->OnUnmaskRequest(request, &response));
      Check(round.server->OnUnmaskResponse(response));
    }
    keystreams = static_cast<double>(k - absent.size());
    for (uint64_t d : absent) {
      for (uint64_t v : round.server->graph().NeighbourhoodOf(d)) keystreams += absent.contains(v) ? 0 : 1;
    }
    state.ResumeTiming();
    Check(round.server->CloseUnmask());
    benchmark::ClobberMemory();
  }
  state.counters["dropped"] = static_cast<double>(absent.size());
  state.counters["keystreams"] = keystreams;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>((n + 1) * 4));
}

// The CNN of the quickstart (225,034 parameters; docs/privacy.md "What each mechanism costs per round").
constexpr int64_t kCnn = 225034;

BENCHMARK(BM_Memcpy)->Arg(kCnn)->Arg(kCoordinates);
BENCHMARK(BM_ClientMask)->ArgsProduct({{10, 100}, {kCnn}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServerUnmask)->ArgsProduct({{10, 100}, {0}, {kCnn}})->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ClientMask)->ArgsProduct({{10, 50, 100}, {kCoordinates}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ServerSum)->ArgsProduct({{10, 50, 100}, {kCoordinates}})->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ServerUnmask)
    ->ArgsProduct({{10, 50, 100}, {0, 10, 30}, {kCoordinates}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace

int main(int argc, char** argv) { return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy"); }

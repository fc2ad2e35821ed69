// A whole SecAgg+ round in one process for the tests: one ServerRound and a ClientRound per participant, the
// messages handed over as the engine and fl-client would carry them, every stage closed by the test (the
// engine's deadlines). Clients listed in a stage's `absent` set send nothing in it (they dropped).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "fl/secagg/client_round.h"
#include "fl/secagg/server_round.h"

namespace fl::secagg::testing {

struct RoundHarness {
  std::unique_ptr<ServerRound> server;
  std::map<uint64_t, std::unique_ptr<ClientRound>> clients;
  std::map<uint64_t, std::vector<float>> inputs;
  std::map<uint64_t, uint32_t> weights;
  std::map<uint64_t, std::vector<uint32_t>> masked;  // what each client uploaded (seen by the server)
  ServerRoundConfig config;
  uint64_t seed = 0;

  // n clients with ids 100, 103, 106, ... and inputs uniform in [-range, range] drawn from `seed`.
  static RoundHarness Make(size_t n, uint64_t dimension, QuantizationSpec spec, uint64_t seed,
                           GraphOptions graph = {}) {
    RoundHarness h;
    h.seed = seed;
    h.config.round = 7;
    h.config.dimension = dimension;
    h.config.quantization = spec;
    h.config.graph = graph;
    RandomSource values = RandomSource::SeededForTests(seed ^ 0xabcdef);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = 100 + 3 * i;
      h.config.participants.push_back(id);
      std::vector<uint32_t> raw(dimension);
      values.Fill(std::span<uint8_t>(reinterpret_cast<uint8_t*>(raw.data()), raw.size() * 4));
      std::vector<float>& x = h.inputs[id];
      for (uint32_t r : raw) x.push_back(static_cast<float>((r / 4294967295.0 * 2 - 1) * spec.range));
      h.weights[id] = 1 + static_cast<uint32_t>(i % spec.max_weight);
    }
    auto server = ServerRound::Create(h.config, RandomSource::SeededForTests(seed));
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) h.server = *std::move(server);
    return h;
  }

  void Advertise(const std::set<uint64_t>& absent = {}) {
    for (uint64_t id : config.participants) {
      v1::SecAggSetup setup;
      ASSERT_TRUE(server->SetupFor(id, &setup).ok());
      v1::SecAggPublicKeys keys;
      auto c = ClientRound::Start(setup, RandomSource::SeededForTests(seed * 1000 + id), &keys);
      ASSERT_TRUE(c.ok()) << c.status();
      clients[id] = *std::move(c);
      if (!absent.contains(id)) {
        ASSERT_TRUE(server->OnPublicKeys(keys).ok());
      }
    }
    ASSERT_TRUE(server->CloseAdvertiseKeys().ok()) << server->failure();
  }

  void Share(const std::set<uint64_t>& absent = {}) {
    for (uint64_t id : server->Alive()) {
      v1::SecAggNeighbourKeys keys;
      ASSERT_TRUE(server->NeighbourKeysFor(id, &keys).ok());
      v1::SecAggShares shares;
      ASSERT_TRUE(clients[id]->OnNeighbourKeys(keys, &shares).ok());
      if (!absent.contains(id)) {
        ASSERT_TRUE(server->OnShares(shares).ok());
      }
    }
    ASSERT_TRUE(server->CloseShareKeys().ok()) << server->failure();
  }

  // Uploads in chunks of `chunk` coordinates; returns CloseMaskedUpload's status.
  absl::Status Upload(const std::set<uint64_t>& absent = {}, size_t chunk = 97) {
    for (uint64_t id : server->Alive()) {
      v1::SecAggMaskingStart start;
      EXPECT_TRUE(server->MaskingStartFor(id, &start).ok());
      EXPECT_TRUE(clients[id]->OnMaskingStart(start, weights[id]).ok());
      if (absent.contains(id)) continue;  // trained, then dropped before uploading
      const std::vector<float>& x = inputs[id];
      for (size_t off = 0; off < x.size(); off += chunk) {
        v1::SecAggMaskedChunk c;
        const size_t n = std::min(chunk, x.size() - off);
        EXPECT_TRUE(clients[id]->MaskChunk(off, std::span<const float>(x).subspan(off, n), &c).ok());
        Keep(c);
        EXPECT_TRUE(server->OnMaskedChunk(c).ok());
      }
      v1::SecAggMaskedChunk w;
      EXPECT_TRUE(clients[id]->MaskWeight(&w).ok());
      Keep(w);
      EXPECT_TRUE(server->OnMaskedChunk(w).ok());
    }
    return server->CloseMaskedUpload();
  }

  absl::Status Unmask(const std::set<uint64_t>& absent = {}) {
    for (uint64_t id : server->Alive()) {
      v1::SecAggUnmaskRequest request;
      EXPECT_TRUE(server->UnmaskRequestFor(id, &request).ok());
      v1::SecAggUnmaskResponse response;
      EXPECT_TRUE(clients[id]->OnUnmaskRequest(request, &response).ok());
      if (!absent.contains(id)) {
        EXPECT_TRUE(server->OnUnmaskResponse(response).ok());
      }
    }
    return server->CloseUnmask();
  }

  void Keep(const v1::SecAggMaskedChunk& c) {
    std::vector<uint32_t>& out = masked[c.client_id()];
    out.resize(config.dimension + 1);
    std::memcpy(out.data() + c.offset(), c.words().data(), c.words().size());
  }

  // The plain weighted quantised sum over `survivors` (dimension words, then the total weight), mod 2^32.
  std::vector<uint32_t> PlainSum(const std::vector<uint64_t>& survivors) const {
    std::vector<uint32_t> sum(config.dimension + 1, 0);
    for (uint64_t id : survivors) {
      const uint32_t w = weights.at(id);
      for (size_t i = 0; i < config.dimension; ++i) {
        sum[i] += static_cast<uint32_t>(Quantize(config.quantization, inputs.at(id)[i])) * w;
      }
      sum[config.dimension] += w;
    }
    return sum;
  }

  // The weighted mean of the (clipped) inputs in double.
  std::vector<double> PlainMean(const std::vector<uint64_t>& survivors) const {
    std::vector<double> mean(config.dimension, 0);
    double total = 0;
    for (uint64_t id : survivors) {
      const double w = weights.at(id);
      total += w;
      for (size_t i = 0; i < config.dimension; ++i) {
        const double x = std::fmax(-config.quantization.range,
                                   std::fmin(config.quantization.range, static_cast<double>(inputs.at(id)[i])));
        mean[i] += w * x;
      }
    }
    for (double& m : mean) m /= total;
    return mean;
  }
};

}  // namespace fl::secagg::testing

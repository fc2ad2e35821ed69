// The SecAgg+ neighbour graph (Bell et al., CCS 2020): which clients exchange masks and hold each other's
// shares.
//
// The participants are placed on a ring in a random order (a seeded Fisher-Yates shuffle; the server draws the
// seed from libsodium's CSPRNG); each client's neighbourhood is itself and the (k - 1) / 2 clients on either
// side: a random relabelling of the Harary graph H(k - 1, n), (k - 1)-regular, k odd (the neighbourhood size,
// the client itself included, as Flower counts its shares). k = the smallest odd number >= c * log2(n)
// (c = 3 by default), at least 3 and at most 255 (Shamir over GF(2^8)). Rounds of at most `full_graph_max`
// clients (32 by default), or where k would reach n, use the full graph instead (plain SecAgg: every pair).
// The threshold t is the shares needed to reconstruct a client's secret: k / 2 < t <= k, by default
// floor(k / 2) + 1. It must exceed k / 2 so that the server cannot hold t shares of both secrets of one
// client from two disjoint sets of answers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::secagg {

struct GraphOptions {
  double log_factor = 3.0;       // c in k = odd >= c * log2(n)
  uint32_t full_graph_max = 32;  // at most this many clients: the full graph
  uint32_t threshold = 0;        // 0: floor(k / 2) + 1
};

struct NeighbourGraph {
  uint32_t neighbourhood_size = 0;  // k (the full graph: n)
  uint32_t threshold = 0;           // t
  std::vector<uint64_t> clients;    // sorted
  // neighbourhoods[i]: the neighbourhood of clients[i], sorted, clients[i] included.
  std::vector<std::vector<uint64_t>> neighbourhoods;

  // The neighbourhood of `client`; empty when it is not in the graph.
  std::span<const uint64_t> NeighbourhoodOf(uint64_t client) const;
};

// k for n clients under `options` (n when the graph is full).
uint32_t NeighbourhoodSize(uint64_t clients, const GraphOptions& options);

// The graph of `clients` (distinct ids) shuffled by `seed`. Refused: fewer than 2 clients, a repeated id, a
// full graph of more than 255 clients, and a threshold t with t <= k / 2 or t > k
// (kThresholdAboveNeighbours, naming t, k and the allowed range).
absl::StatusOr<NeighbourGraph> BuildNeighbourGraph(std::span<const uint64_t> clients, const GraphOptions& options,
                                                   uint64_t seed);

}  // namespace fl::secagg

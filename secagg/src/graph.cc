#include "fl/secagg/graph.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "fl/core/str_cat.h"
#include "fl/secagg/events.h"

namespace fl::secagg {
namespace {

constexpr uint32_t kMaxHolders = 255;  // Shamir over GF(2^8)

}  // namespace

std::span<const uint64_t> NeighbourGraph::NeighbourhoodOf(uint64_t client) const {
  const auto it = std::lower_bound(clients.begin(), clients.end(), client);
  if (it == clients.end() || *it != client) return {};
  return neighbourhoods[static_cast<size_t>(it - clients.begin())];
}

uint32_t NeighbourhoodSize(uint64_t clients, const GraphOptions& options) {
  if (clients <= options.full_graph_max) return static_cast<uint32_t>(clients);
  uint32_t k = static_cast<uint32_t>(std::ceil(options.log_factor * std::log2(static_cast<double>(clients))));
  k = std::max<uint32_t>(k, 3);
  if (k % 2 == 0) ++k;
  k = std::min(k, kMaxHolders);
  if (k >= clients) return static_cast<uint32_t>(clients);
  return k;
}

absl::StatusOr<NeighbourGraph> BuildNeighbourGraph(std::span<const uint64_t> clients, const GraphOptions& options,
                                                   uint64_t seed) {
  NeighbourGraph g;
  g.clients.assign(clients.begin(), clients.end());
  std::sort(g.clients.begin(), g.clients.end());
  if (g.clients.size() < 2) {
    return absl::InvalidArgumentError(
        fl::StrCat("secure aggregation needs at least 2 clients in a round, has ", g.clients.size()));
  }
  if (auto dup = std::adjacent_find(g.clients.begin(), g.clients.end()); dup != g.clients.end()) {
    return Refusal(SecurityEventKind::kDuplicate, absl::StatusCode::kInvalidArgument,
                   fl::StrCat("client id ", *dup, " appears twice among the round's participants"));
  }
  const uint64_t n = g.clients.size();
  const uint32_t k = NeighbourhoodSize(n, options);
  if (k > kMaxHolders) {
    return absl::InvalidArgumentError(fl::StrCat("a full secure-aggregation graph of ", n,
                                                 " clients needs more than 255 share holders (GF(2^8)); set "
                                                 "full_graph_max below ",
                                                 kMaxHolders + 1));
  }
  const uint32_t t = options.threshold == 0 ? k / 2 + 1 : options.threshold;
  if (t <= k / 2 || t > k) {
    return Refusal(
        SecurityEventKind::kThresholdAboveNeighbours, absl::StatusCode::kInvalidArgument,
        fl::StrCat("secagg threshold ", t, " with neighbourhoods of ", k, " clients (", n,
                   " in the round): it must be in [", k / 2 + 1, ", ", k,
                   "] (more than half of a neighbourhood, at most all of it); set it there or 0 for ", k / 2 + 1));
  }
  g.neighbourhood_size = k;
  g.threshold = t;
  g.neighbourhoods.resize(n);
  if (k == n) {
    for (auto& hood : g.neighbourhoods) hood = g.clients;
    return g;
  }
  // The ring order: positions shuffled by the seed (std::mt19937_64 only orders the ring; the server is
  // trusted to pick it, so it need not be unpredictable to the clients, and a seed makes a round repeatable).
  std::vector<size_t> ring(n);
  for (size_t i = 0; i < n; ++i) ring[i] = i;
  std::mt19937_64 engine(seed);
  for (size_t i = n - 1; i > 0; --i) {
    std::uniform_int_distribution<size_t> pick(0, i);
    std::swap(ring[i], ring[pick(engine)]);
  }
  const uint32_t half = (k - 1) / 2;
  for (size_t pos = 0; pos < n; ++pos) {
    auto& hood = g.neighbourhoods[ring[pos]];
    for (int64_t d = -static_cast<int64_t>(half); d <= static_cast<int64_t>(half); ++d) {
      const size_t other = static_cast<size_t>((static_cast<int64_t>(pos + n) + d) % static_cast<int64_t>(n));
      hood.push_back(g.clients[ring[other]]);
    }
    std::sort(hood.begin(), hood.end());
  }
  return g;
}

}  // namespace fl::secagg

// Partitioning a labelled dataset across federated clients: IID, Dirichlet label skew, McMahan shards.
//
// Every partitioner is a pure function of (spec, labels, number of clients, seed): client i of n gets
// exactly the same example indices on every run, platform and standard library (see
// deterministic_random.h), so a recorded experiment can be replayed. Each client's indices are returned
// sorted ascending (a set; the trainer shuffles per epoch with its own seed); across clients every index
// appears exactly once.
//
//  - iid:                  shuffle, then cut into n parts whose sizes differ by at most one.
//  - dirichlet:<alpha>:    for each class, shuffle its examples, draw proportions p ~ Dir(alpha, ..., alpha)
//                          over the n clients and cut the class at floor(cumsum(p) * class size) (Hsu et al.
//                          2019; as in NIID-Bench / FedLab, without their size rebalancing). Small alpha:
//                          each client sees few classes; alpha -> inf: IID-like label mix. The whole draw is
//                          repeated (at most max_attempts times) until every client has >= min_examples.
//  - shards:<s>:           (McMahan et al. 2017) sort by label (stably), cut into n*s contiguous shards of
//                          nearly equal size, give each client s shards drawn at random. A shard spans few
//                          labels, so a client sees about s classes.
//  - natural:              one shard per distinct client id (a `client_id` array of the data: a writer, a
//                          user, a device): the distinct ids sorted ascending, client k of n gets the ids at
//                          positions k, k+n, k+2n, ... of that order (PartitionNatural). Needs at least n
//                          distinct ids. Realistic non-IID data: what one user has is what one client trains.
//
// Labels are uint8 (Fashion-MNIST) or int64 (any dataset, labels >= 0); for the same label values both give
// the same partition.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::training::data {

enum class PartitionKind : uint8_t { kIid = 0, kDirichlet = 1, kShards = 2, kNatural = 3 };

std::string_view PartitionKindName(PartitionKind kind);  // "iid", "dirichlet", "shards", "natural"

inline constexpr uint32_t kDefaultDirichletMinExamples = 1;
inline constexpr uint32_t kDefaultDirichletMaxAttempts = 1000;

struct PartitionSpec {
  PartitionKind kind = PartitionKind::kIid;
  double alpha = 0.0;                                    // dirichlet: concentration, > 0
  uint32_t min_examples = kDefaultDirichletMinExamples;  // dirichlet: resample until every client has this
  uint32_t max_attempts = kDefaultDirichletMaxAttempts;  // dirichlet: bound on the resampling
  uint32_t shards_per_client = 0;                        // shards: >= 1

  static PartitionSpec Iid();
  static PartitionSpec Dirichlet(double alpha, uint32_t min_examples = kDefaultDirichletMinExamples);
  static PartitionSpec Shards(uint32_t shards_per_client);
  static PartitionSpec Natural();

  // "iid" | "dirichlet:<alpha>[:min=<n>][:attempts=<n>]" | "shards:<per_client>" | "natural".
  static absl::StatusOr<PartitionSpec> Parse(std::string_view text);
  // The canonical text form; Parse(ToString()) gives back an equal spec.
  std::string ToString() const;
  absl::Status Validate() const;

  friend bool operator==(const PartitionSpec&, const PartitionSpec&) = default;
};

// Indices into `labels` for each of num_clients clients. Errors: invalid spec, no clients, more clients
// (or shards) than examples, Dirichlet minimum impossible or not reached within max_attempts, a negative
// label, and the natural kind (which needs client ids, not labels: PartitionNatural).
absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const PartitionSpec& spec, std::span<const uint8_t> labels,
                                                             uint32_t num_clients, uint64_t seed);
absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const PartitionSpec& spec, std::span<const int64_t> labels,
                                                             uint32_t num_clients, uint64_t seed);

// Client `client_index`'s part of Partition(spec, labels, num_clients, seed).
absl::StatusOr<std::vector<uint32_t>> PartitionFor(uint32_t client_index, const PartitionSpec& spec,
                                                   std::span<const uint8_t> labels, uint32_t num_clients,
                                                   uint64_t seed);
absl::StatusOr<std::vector<uint32_t>> PartitionFor(uint32_t client_index, const PartitionSpec& spec,
                                                   std::span<const int64_t> labels, uint32_t num_clients,
                                                   uint64_t seed);

// The IID part of client `client_index` of `num_examples` unlabelled examples: the same indices as
// PartitionFor(client_index, PartitionSpec::Iid(), labels, ...) for any labels of that length.
absl::StatusOr<std::vector<uint32_t>> PartitionIidFor(uint32_t client_index, uint64_t num_examples,
                                                      uint32_t num_clients, uint64_t seed);

// The natural partition: example i belongs to client_ids[i]'s shard (see the top of this file). No seed: it
// is fixed by the ids. Errors: no clients, more clients than examples or than distinct ids (naming both).
absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionNatural(std::span<const int64_t> client_ids,
                                                                    uint32_t num_clients);
absl::StatusOr<std::vector<uint32_t>> PartitionNaturalFor(uint32_t client_index, std::span<const int64_t> client_ids,
                                                          uint32_t num_clients);

// Number of examples of each class among `indices` (size num_classes). Errors: an index outside `labels`
// or a label >= num_classes.
absl::StatusOr<std::vector<uint32_t>> LabelHistogram(std::span<const uint8_t> labels, std::span<const uint32_t> indices,
                                                     uint32_t num_classes);

// A deterministic train/validation split of a client's indices: floor(validation_fraction * size) indices,
// drawn at random, go to validation; both parts are sorted ascending. validation_fraction in [0, 1).
struct TrainValidationSplit {
  std::vector<uint32_t> train;
  std::vector<uint32_t> validation;
};
absl::StatusOr<TrainValidationSplit> SplitTrainValidation(std::span<const uint32_t> indices, double validation_fraction,
                                                          uint64_t seed);

}  // namespace fl::training::data

#include "fl/training/data/partition.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/training/data/deterministic_random.h"

namespace fl::training::data {
namespace {

// Random streams of one seed, one per use, so that e.g. the validation split of a client is not
// correlated with the shuffle that partitioned the data. Changing these changes every recorded partition.
constexpr uint64_t kStreamIid = 1;
constexpr uint64_t kStreamDirichlet = 2;
constexpr uint64_t kStreamShards = 3;
constexpr uint64_t kStreamValidation = 4;

constexpr std::string_view kSpecForms =
    "iid, dirichlet:<alpha>[:min=<n>][:attempts=<n>], shards:<per_client> or natural";

using Partitioning = std::vector<std::vector<uint32_t>>;

std::vector<std::string_view> SplitColons(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t colon = text.find(':', start);
    if (colon == std::string_view::npos) {
      parts.push_back(text.substr(start));
      return parts;
    }
    parts.push_back(text.substr(start, colon - start));
    start = colon + 1;
  }
}

absl::StatusOr<uint32_t> ParseUint32(std::string_view text, std::string_view what, std::string_view spec) {
  uint32_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return absl::InvalidArgumentError(
        fl::StrCat("partition spec '", spec, "': ", what, " must be a non-negative integer, got '", text, "'"));
  }
  return value;
}

absl::StatusOr<double> ParseDouble(std::string_view text, std::string_view what, std::string_view spec) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        fl::StrCat("partition spec '", spec, "': ", what, " must be a finite number, got '", text, "'"));
  }
  return value;
}

std::string FormatDouble(double value) {
  char buffer[64];
  auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);  // shortest round-trip form
  return ec == std::errc() ? std::string(buffer, ptr) : std::string("nan");
}

// Indices of each label value, ascending.
std::vector<std::vector<uint32_t>> IndicesByClass(std::span<const uint8_t> labels) {
  std::array<uint32_t, 256> counts{};
  for (uint8_t label : labels) ++counts[label];
  size_t num_classes = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    if (counts[c] > 0) num_classes = c + 1;
  }
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (size_t c = 0; c < num_classes; ++c) by_class[c].reserve(counts[c]);
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<uint32_t>(i));
  return by_class;
}

// The same for arbitrary non-negative labels: one list per distinct label, in ascending label order. The
// partitioners skip empty classes without drawing, so for labels < 256 this gives exactly the partitions of
// the uint8 version (which lists empty classes too).
absl::StatusOr<std::vector<std::vector<uint32_t>>> IndicesByClass(std::span<const int64_t> labels) {
  std::vector<int64_t> distinct(labels.begin(), labels.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (!distinct.empty() && distinct.front() < 0) {
    const auto negative = std::find(labels.begin(), labels.end(), distinct.front());
    return absl::InvalidArgumentError(fl::StrCat("partition: example ", negative - labels.begin(), " has label ",
                                                 distinct.front(), "; labels must be class indices >= 0"));
  }
  std::vector<std::vector<uint32_t>> by_class(distinct.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto c = std::lower_bound(distinct.begin(), distinct.end(), labels[i]) - distinct.begin();
    by_class[static_cast<size_t>(c)].push_back(static_cast<uint32_t>(i));
  }
  return by_class;
}

void SortEach(Partitioning& parts) {
  for (auto& part : parts) std::sort(part.begin(), part.end());
}

Partitioning PartitionIid(size_t num_examples, uint32_t num_clients, uint64_t seed) {
  std::vector<uint32_t> order(num_examples);
  for (size_t i = 0; i < num_examples; ++i) order[i] = static_cast<uint32_t>(i);
  Engine engine = MakeEngine(seed, kStreamIid);
  Shuffle(engine, order);
  Partitioning parts(num_clients);
  for (uint32_t k = 0; k < num_clients; ++k) {
    const uint64_t begin = uint64_t{k} * num_examples / num_clients;
    const uint64_t end = (uint64_t{k} + 1) * num_examples / num_clients;
    parts[k].assign(order.begin() + static_cast<ptrdiff_t>(begin), order.begin() + static_cast<ptrdiff_t>(end));
  }
  SortEach(parts);
  return parts;
}

absl::StatusOr<Partitioning> PartitionDirichlet(const PartitionSpec& spec,
                                                const std::vector<std::vector<uint32_t>>& by_class, size_t num_examples,
                                                uint32_t num_clients, uint64_t seed) {
  if (uint64_t{spec.min_examples} * num_clients > num_examples) {
    return absl::InvalidArgumentError(
        fl::StrCat("partition ", spec.ToString(), ": ", num_clients, " clients with at least ", spec.min_examples,
                   " examples each need more than the ", num_examples, " examples there are"));
  }
  Engine engine = MakeEngine(seed, kStreamDirichlet);
  std::vector<uint32_t> shuffled;
  std::vector<double> weights(num_clients);
  size_t best_smallest = 0;
  for (uint32_t attempt = 0; attempt < spec.max_attempts; ++attempt) {
    Partitioning parts(num_clients);
    for (const auto& members : by_class) {
      if (members.empty()) continue;
      shuffled = members;
      Shuffle(engine, shuffled);
      // Proportions ~ Dir(alpha): normalised Gamma(alpha) draws, taken in log space (tiny alphas underflow).
      double max_log = -std::numeric_limits<double>::infinity();
      for (uint32_t k = 0; k < num_clients; ++k) {
        weights[k] = LogGamma(engine, spec.alpha);
        max_log = std::max(max_log, weights[k]);
      }
      double total = 0.0;
      for (uint32_t k = 0; k < num_clients; ++k) {
        weights[k] = Exp(weights[k] - max_log);
        total += weights[k];
      }
      const size_t m = shuffled.size();
      double cumulative = 0.0;
      size_t begin = 0;
      for (uint32_t k = 0; k < num_clients; ++k) {
        cumulative += weights[k];
        size_t end = m;
        if (k + 1 < num_clients) {
          const double cut = std::floor(cumulative / total * static_cast<double>(m));
          end = std::clamp<size_t>(cut > 0.0 ? static_cast<size_t>(cut) : 0, begin, m);
        }
        parts[k].insert(parts[k].end(), shuffled.begin() + static_cast<ptrdiff_t>(begin),
                        shuffled.begin() + static_cast<ptrdiff_t>(end));
        begin = end;
      }
    }
    size_t smallest = std::numeric_limits<size_t>::max();
    for (const auto& part : parts) smallest = std::min(smallest, part.size());
    if (smallest >= spec.min_examples) {
      SortEach(parts);
      return parts;
    }
    best_smallest = std::max(best_smallest, smallest);
  }
  return absl::FailedPreconditionError(fl::StrCat(
      "partition ", spec.ToString(), " of ", num_examples, " examples over ", num_clients, " clients: none of ",
      spec.max_attempts, " draws gave every client at least ", spec.min_examples,
      " examples (the best draw's smallest client had ", best_smallest,
      "); use a larger alpha, fewer clients, or a smaller minimum (e.g. dirichlet:", FormatDouble(spec.alpha),
      ":min=0 allows empty clients)"));
}

absl::StatusOr<Partitioning> PartitionShards(const PartitionSpec& spec,
                                             const std::vector<std::vector<uint32_t>>& by_class, size_t num_examples,
                                             uint32_t num_clients, uint64_t seed) {
  const uint64_t num_shards = uint64_t{num_clients} * spec.shards_per_client;
  const uint64_t n = num_examples;
  if (num_shards > n) {
    return absl::InvalidArgumentError(fl::StrCat("partition ", spec.ToString(), ": ", num_clients, " clients x ",
                                                 spec.shards_per_client, " shards = ", num_shards,
                                                 " shards, more than the ", n, " examples there are"));
  }
  // Sorted by label, ties by index (a stable sort), then cut into num_shards nearly equal runs.
  std::vector<uint32_t> sorted;
  sorted.reserve(num_examples);
  for (const auto& members : by_class) sorted.insert(sorted.end(), members.begin(), members.end());
  std::vector<uint32_t> shard_order(num_shards);
  for (uint64_t j = 0; j < num_shards; ++j) shard_order[j] = static_cast<uint32_t>(j);
  Engine engine = MakeEngine(seed, kStreamShards);
  Shuffle(engine, shard_order);
  Partitioning parts(num_clients);
  for (uint32_t k = 0; k < num_clients; ++k) {
    for (uint32_t j = 0; j < spec.shards_per_client; ++j) {
      const uint64_t shard = shard_order[uint64_t{k} * spec.shards_per_client + j];
      const uint64_t begin = shard * n / num_shards;
      const uint64_t end = (shard + 1) * n / num_shards;
      parts[k].insert(parts[k].end(), sorted.begin() + static_cast<ptrdiff_t>(begin),
                      sorted.begin() + static_cast<ptrdiff_t>(end));
    }
  }
  SortEach(parts);
  return parts;
}

// Checks shared by every partitioner.
absl::Status CheckRequest(const PartitionSpec& spec, size_t num_examples, uint32_t num_clients) {
  if (auto status = spec.Validate(); !status.ok()) return status;
  if (num_clients == 0) return absl::InvalidArgumentError("partition: the number of clients must be at least 1");
  if (num_examples > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(fl::StrCat("partition: ", num_examples, " examples do not fit 32-bit indices"));
  }
  if (num_clients > num_examples) {
    return absl::InvalidArgumentError(fl::StrCat("partition ", spec.ToString(), ": more clients (", num_clients,
                                                 ") than examples (", num_examples, ")"));
  }
  return absl::OkStatus();
}

absl::Status NaturalNeedsClientIds() {
  return absl::FailedPreconditionError(
      "partition natural: needs each example's client id (a `client_id` array in the .npz, one integer per "
      "training example); these data have none: use iid, dirichlet:<alpha> or shards:<per_client>, or add the "
      "array");
}

// Labels are only looked at (through by_class, computed on demand) by the label-aware partitioners.
template <typename ByClass>
absl::StatusOr<Partitioning> Dispatch(const PartitionSpec& spec, size_t num_examples, uint32_t num_clients,
                                      uint64_t seed, const ByClass& by_class) {
  if (auto status = CheckRequest(spec, num_examples, num_clients); !status.ok()) return status;
  switch (spec.kind) {
    case PartitionKind::kIid: return PartitionIid(num_examples, num_clients, seed);
    case PartitionKind::kDirichlet: {
      auto classes = by_class();
      if (!classes.ok()) return classes.status();
      return PartitionDirichlet(spec, *classes, num_examples, num_clients, seed);
    }
    case PartitionKind::kShards: {
      auto classes = by_class();
      if (!classes.ok()) return classes.status();
      return PartitionShards(spec, *classes, num_examples, num_clients, seed);
    }
    case PartitionKind::kNatural: return NaturalNeedsClientIds();
  }
  return absl::InvalidArgumentError("unknown partition kind");
}

absl::Status CheckClientIndex(uint32_t client_index, uint32_t num_clients) {
  if (client_index >= num_clients) {
    return absl::InvalidArgumentError(
        fl::StrCat("partition: client index ", client_index, " is out of range for ", num_clients, " clients"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> Pick(absl::StatusOr<Partitioning> parts, uint32_t client_index) {
  if (!parts.ok()) return parts.status();
  return std::move((*parts)[client_index]);
}

}  // namespace

std::string_view PartitionKindName(PartitionKind kind) {
  switch (kind) {
    case PartitionKind::kIid: return "iid";
    case PartitionKind::kDirichlet: return "dirichlet";
    case PartitionKind::kShards: return "shards";
    case PartitionKind::kNatural: return "natural";
  }
  return "unknown";
}

PartitionSpec PartitionSpec::Iid() { return PartitionSpec{}; }

PartitionSpec PartitionSpec::Dirichlet(double alpha, uint32_t min_examples) {
  PartitionSpec spec;
  spec.kind = PartitionKind::kDirichlet;
  spec.alpha = alpha;
  spec.min_examples = min_examples;
  return spec;
}

PartitionSpec PartitionSpec::Natural() {
  PartitionSpec spec;
  spec.kind = PartitionKind::kNatural;
  return spec;
}

PartitionSpec PartitionSpec::Shards(uint32_t shards_per_client) {
  PartitionSpec spec;
  spec.kind = PartitionKind::kShards;
  spec.shards_per_client = shards_per_client;
  return spec;
}

absl::StatusOr<PartitionSpec> PartitionSpec::Parse(std::string_view text) {
  const std::vector<std::string_view> parts = SplitColons(text);
  const std::string_view kind = parts[0];
  PartitionSpec spec;
  if (kind == "iid") {
    if (parts.size() != 1) {
      return absl::InvalidArgumentError(
          fl::StrCat("partition spec '", text, "': iid takes no parameters; expected ", kSpecForms));
    }
    return spec;
  }
  if (kind == "natural") {
    if (parts.size() != 1) {
      return absl::InvalidArgumentError(
          fl::StrCat("partition spec '", text, "': natural takes no parameters (one shard per client id)"));
    }
    return Natural();
  }
  if (kind == "dirichlet") {
    if (parts.size() < 2) {
      return absl::InvalidArgumentError(
          fl::StrCat("partition spec '", text, "': dirichlet needs a concentration, e.g. dirichlet:0.5"));
    }
    spec.kind = PartitionKind::kDirichlet;
    auto alpha = ParseDouble(parts[1], "the dirichlet alpha", text);
    if (!alpha.ok()) return alpha.status();
    spec.alpha = *alpha;
    for (size_t i = 2; i < parts.size(); ++i) {
      const std::string_view option = parts[i];
      if (option.starts_with("min=")) {
        auto value = ParseUint32(option.substr(4), "min", text);
        if (!value.ok()) return value.status();
        spec.min_examples = *value;
      } else if (option.starts_with("attempts=")) {
        auto value = ParseUint32(option.substr(9), "attempts", text);
        if (!value.ok()) return value.status();
        spec.max_attempts = *value;
      } else {
        return absl::InvalidArgumentError(fl::StrCat("partition spec '", text, "': unknown dirichlet option '", option,
                                                     "'; expected min=<n> or attempts=<n>"));
      }
    }
  } else if (kind == "shards") {
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          fl::StrCat("partition spec '", text, "': shards takes one parameter, the shards per client, e.g. shards:2"));
    }
    spec.kind = PartitionKind::kShards;
    auto shards = ParseUint32(parts[1], "the shards per client", text);
    if (!shards.ok()) return shards.status();
    spec.shards_per_client = *shards;
  } else {
    return absl::InvalidArgumentError(
        fl::StrCat("partition spec '", text, "': unknown partition kind '", kind, "'; expected ", kSpecForms));
  }
  if (auto status = spec.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("partition spec '", text, "': ", fl::ToStd(status.message())));
  }
  return spec;
}

std::string PartitionSpec::ToString() const {
  switch (kind) {
    case PartitionKind::kIid: return "iid";
    case PartitionKind::kDirichlet: {
      std::string text = fl::StrCat("dirichlet:", FormatDouble(alpha));
      if (min_examples != kDefaultDirichletMinExamples) text += fl::StrCat(":min=", min_examples);
      if (max_attempts != kDefaultDirichletMaxAttempts) text += fl::StrCat(":attempts=", max_attempts);
      return text;
    }
    case PartitionKind::kShards: return fl::StrCat("shards:", shards_per_client);
    case PartitionKind::kNatural: return "natural";
  }
  return "unknown";
}

absl::Status PartitionSpec::Validate() const {
  switch (kind) {
    case PartitionKind::kIid: return absl::OkStatus();
    case PartitionKind::kDirichlet:
      if (!(alpha > 0.0) || !std::isfinite(alpha)) {
        return absl::InvalidArgumentError(
            fl::StrCat("the dirichlet alpha must be a finite number > 0, got ", FormatDouble(alpha)));
      }
      if (max_attempts == 0) return absl::InvalidArgumentError("dirichlet attempts must be at least 1");
      return absl::OkStatus();
    case PartitionKind::kShards:
      if (shards_per_client == 0) return absl::InvalidArgumentError("shards per client must be at least 1");
      return absl::OkStatus();
    case PartitionKind::kNatural: return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown partition kind");
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const PartitionSpec& spec, std::span<const uint8_t> labels,
                                                             uint32_t num_clients, uint64_t seed) {
  return Dispatch(spec, labels.size(), num_clients, seed,
                  [&]() -> absl::StatusOr<Partitioning> { return IndicesByClass(labels); });
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> Partition(const PartitionSpec& spec, std::span<const int64_t> labels,
                                                             uint32_t num_clients, uint64_t seed) {
  return Dispatch(spec, labels.size(), num_clients, seed, [&] { return IndicesByClass(labels); });
}

absl::StatusOr<std::vector<uint32_t>> PartitionFor(uint32_t client_index, const PartitionSpec& spec,
                                                   std::span<const uint8_t> labels, uint32_t num_clients,
                                                   uint64_t seed) {
  if (auto status = CheckClientIndex(client_index, num_clients); !status.ok()) return status;
  return Pick(Partition(spec, labels, num_clients, seed), client_index);
}

absl::StatusOr<std::vector<uint32_t>> PartitionFor(uint32_t client_index, const PartitionSpec& spec,
                                                   std::span<const int64_t> labels, uint32_t num_clients,
                                                   uint64_t seed) {
  if (auto status = CheckClientIndex(client_index, num_clients); !status.ok()) return status;
  return Pick(Partition(spec, labels, num_clients, seed), client_index);
}

absl::StatusOr<std::vector<uint32_t>> PartitionIidFor(uint32_t client_index, uint64_t num_examples,
                                                      uint32_t num_clients, uint64_t seed) {
  if (auto status = CheckClientIndex(client_index, num_clients); !status.ok()) return status;
  auto no_labels = []() -> absl::StatusOr<Partitioning> { return Partitioning{}; };
  return Pick(Dispatch(PartitionSpec::Iid(), static_cast<size_t>(num_examples), num_clients, seed, no_labels),
              client_index);
}

absl::StatusOr<std::vector<std::vector<uint32_t>>> PartitionNatural(std::span<const int64_t> client_ids,
                                                                    uint32_t num_clients) {
  if (auto status = CheckRequest(PartitionSpec::Natural(), client_ids.size(), num_clients); !status.ok()) {
    return status;
  }
  std::vector<int64_t> ids(client_ids.begin(), client_ids.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (num_clients > ids.size()) {
    return absl::InvalidArgumentError(fl::StrCat("partition natural: ", num_clients, " clients but the data have only ",
                                                 ids.size(), " distinct client ids; run at most ", ids.size(),
                                                 " clients, or use iid/dirichlet/shards"));
  }
  Partitioning parts(num_clients);
  for (size_t i = 0; i < client_ids.size(); ++i) {
    const size_t rank = static_cast<size_t>(std::lower_bound(ids.begin(), ids.end(), client_ids[i]) - ids.begin());
    parts[rank % num_clients].push_back(static_cast<uint32_t>(i));  // ascending already
  }
  return parts;
}

absl::StatusOr<std::vector<uint32_t>> PartitionNaturalFor(uint32_t client_index, std::span<const int64_t> client_ids,
                                                          uint32_t num_clients) {
  if (auto status = CheckClientIndex(client_index, num_clients); !status.ok()) return status;
  return Pick(PartitionNatural(client_ids, num_clients), client_index);
}

absl::StatusOr<std::vector<uint32_t>> LabelHistogram(std::span<const uint8_t> labels, std::span<const uint32_t> indices,
                                                     uint32_t num_classes) {
  std::vector<uint32_t> histogram(num_classes, 0);
  for (uint32_t index : indices) {
    if (index >= labels.size()) {
      return absl::InvalidArgumentError(
          fl::StrCat("label histogram: index ", index, " is out of range for ", labels.size(), " examples"));
    }
    const uint8_t label = labels[index];
    if (label >= num_classes) {
      return absl::InvalidArgumentError(fl::StrCat("label histogram: example ", index, " has label ",
                                                   static_cast<int>(label), ", not in [0, ", num_classes, ")"));
    }
    ++histogram[label];
  }
  return histogram;
}

absl::StatusOr<TrainValidationSplit> SplitTrainValidation(std::span<const uint32_t> indices, double validation_fraction,
                                                          uint64_t seed) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        fl::StrCat("validation fraction must be in [0, 1), got ", FormatDouble(validation_fraction)));
  }
  std::vector<uint32_t> order(indices.begin(), indices.end());
  Engine engine = MakeEngine(seed, kStreamValidation);
  Shuffle(engine, order);
  const auto num_validation = static_cast<size_t>(validation_fraction * static_cast<double>(order.size()));
  TrainValidationSplit split;
  split.validation.assign(order.begin(), order.begin() + static_cast<ptrdiff_t>(num_validation));
  split.train.assign(order.begin() + static_cast<ptrdiff_t>(num_validation), order.end());
  std::sort(split.validation.begin(), split.validation.end());
  std::sort(split.train.begin(), split.train.end());
  return split;
}

}  // namespace fl::training::data

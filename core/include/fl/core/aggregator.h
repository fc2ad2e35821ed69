// Aggregators: combine clients' flat fp32 updates (models or pseudo-gradients) into one vector.
//
// An aggregator is bound to one ModelSpec. Every update is checked before any of its values are used:
// spec fingerprint and size (CheckMatchesSpec), weight (finite, in [kMinUpdateWeight, kMaxUpdateWeight]),
// values (no NaN/Inf, |x| <= max_abs_value(), at most kMaxUpdateAbsValue; the error names the tensor). A rejected
// update leaves the aggregator exactly as it was (bit for bit), so the server can drop a bad client and go on.
//
// Implementations (see MakeAggregator for their names):
//   - WeightedMeanAggregator ("mean"): FedAvg's sum_k w_k x_k / sum_k w_k. Streaming: two fp32 buffers
//     of P values whatever the number of updates.
//   - CoordinateMedianAggregator ("median"): Flower's FedMedian, coordinate-wise median.
//   - TrimmedMeanAggregator ("trimmed_mean:<beta>"): Flower's FedTrimmedAvg, coordinate-wise mean after
//     dropping the floor(beta * n) smallest and largest values.
// The robust two are unweighted, like Flower's (weights are still validated and summed in total_weight()):
// a weight is the client's own claim, and a robust aggregator must not let one client buy influence with
// it. They must buffer every update (n * P floats): order statistics cannot be streamed exactly.
//
// Not thread-safe: the server serialises Add calls per aggregator (or shards the model across several).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/codec.h"
#include "fl/core/tensor_spec.h"

namespace fl::core {

// Limits on what an update may carry. They are far beyond any real model or example count, and they
// are what makes the fp32 accumulator of WeightedMeanAggregator provably overflow-free: every product
// w * x stays below 2^40 * 2^64 = 2^104, and at most 2^20 of them are summed, so |sum| < 2^124 < FLT_MAX.
// A weight is an example count or 1.0 in practice; a value of 1.8e19 in a model or pseudo-gradient has
// diverged long before.
inline constexpr double kMinUpdateWeight = 1e-12;
inline constexpr double kMaxUpdateWeight = 1e12;
inline constexpr float kMaxUpdateAbsValue = 18446744073709551616.0f;  // 2^64
inline constexpr size_t kMaxUpdatesPerAggregate = size_t{1} << 20;

// Norm bounding of updates (fl-server --clip-update-norm): before an update is aggregated, its L2 norm over
// the float tensors (integer tensors are client-local counters, restored after every step, and left out) is
// computed, and an update whose norm exceeds the bound is scaled down to it. This caps what any one client
// can move the model by, whatever values it sends (Sun et al. 2019, "Can you really backdoor federated
// learning?"). Modes:
//   off      no bounding (the default of the weighted mean)
//   <x>      a fixed bound x > 0, for every aggregator
//   median   the median of the norms of the round's accepted updates (the default of the robust aggregators,
//            median and trimmed mean): scale-free, so it needs no tuning per model; only aggregators that
//            keep every update can use it (the mean is streamed and cannot know the median in advance)
struct NormClip {
  enum class Mode { kOff, kFixed, kMedian };
  Mode mode = Mode::kOff;
  double max_norm = 0;  // kFixed only

  // "off" (or "0"), "median", or a positive finite number; InvalidArgument otherwise, naming the text.
  static absl::StatusOr<NormClip> Parse(std::string_view text);
  std::string ToString() const;  // what Parse accepts
};

// L2 norm of `values` over the spec's non-integer tensors, accumulated in double (finite for any finite
// fp32 input); NaN/Inf propagate.
double UpdateNorm(const ModelSpec& spec, std::span<const float> values);

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // "mean", "median", "trimmed_mean:0.2": the name MakeAggregator accepts for this configuration.
  virtual std::string name() const = 0;

  const ModelSpec& spec() const { return *spec_; }
  const std::shared_ptr<const ModelSpec>& shared_spec() const { return spec_; }

  // Adds one update. `spec_fingerprint` is the fingerprint the sender declared for its model; `source`
  // names the sender in errors ("client 7", "worker a3f"). Errors: FailedPrecondition (other model),
  // InvalidArgument (size, weight, NaN/Inf, out of range), ResourceExhausted (kMaxUpdatesPerAggregate
  // reached). On error nothing changes.
  absl::Status Add(std::span<const float> values, double weight, uint64_t spec_fingerprint, std::string_view source);

  // Adds one encoded update: the payload is validated and decoded by `codec` (which guarantees finite
  // values), then treated exactly like Add. Payload errors are prefixed with `source`. On error nothing
  // changes. With options.transfer_verified (the caller checked the payload's transfer checksum) an fp32
  // payload is added straight from its bytes, without a decoded copy: Add's range check is the finite check.
  absl::Status AddEncoded(const Codec& codec, std::span<const uint8_t> payload, double weight,
                          uint64_t spec_fingerprint, std::string_view source, const DecodeOptions& options = {});

  // The largest |value| an update added from now on may carry (default kMaxUpdateAbsValue); an update with a
  // larger one is refused (InvalidArgument naming the tensor, element and value, and `source`, e.g. the flag that
  // set the bound). InvalidArgument unless limit is in (0, kMaxUpdateAbsValue]. fl-server sets a much tighter
  // bound than the default (--max-update-value): the default only keeps the fp32 sum finite.
  absl::Status SetMaxAbsValue(double limit, std::string source = "");
  float max_abs_value() const { return max_abs_value_; }

  // Norm bounding of every update added from now on (see NormClip). InvalidArgument for kMedian on an
  // aggregator that does not keep its updates (the mean), or a fixed bound that is not finite and > 0.
  absl::Status SetNormClip(NormClip clip);
  const NormClip& norm_clip() const { return clip_; }
  // Updates scaled down by the bound so far (kFixed: when added; kMedian: counted by Finish).
  size_t num_clipped() const { return num_clipped_; }

  size_t num_updates() const { return num_updates_; }
  // Sum of accepted weights (in double: it is a count, and exact up to 2^53).
  double total_weight() const { return total_weight_; }

  // The aggregate of the updates added so far (spec().num_elements() values). FailedPrecondition when no
  // update was accepted. Does not reset: more updates may be added and Finish called again.
  absl::StatusOr<std::vector<float>> Finish() const;

  // Forgets every update (keeps allocated memory for the next round).
  void Reset();

 protected:
  explicit Aggregator(std::shared_ptr<const ModelSpec> spec);

  // Adds `values` (spec().num_elements() of them, weight already validated) if every |value| is at most
  // max_abs_value() (NaN and Inf fail too) and returns true; otherwise returns false and leaves the
  // aggregate exactly as it was. The range check is the implementation's, so that it can be fused with
  // the pass that uses the values.
  virtual bool TryAdd(std::span<const float> values, float weight) = 0;
  // Where AddEncoded decodes a payload before calling TryAdd on that same span: an implementation may
  // hand out memory it is about to write anyway (the mean's spare accumulator, the median's next row) to
  // spare a copy. Default: a scratch buffer of the base class.
  virtual std::span<float> DecodeBuffer();
  virtual void FinishInto(std::span<float> out) const = 0;
  virtual void ResetState() = 0;
  // Whether the implementation keeps every update (and so can apply a kMedian bound at Finish).
  virtual bool KeepsUpdates() const { return false; }

  // kMedian: the scale of each accepted update in order (1, or median norm / its norm), set by Finish before
  // FinishInto; empty otherwise.
  mutable std::vector<float> row_scales_;
  // The bit pattern of max_abs_value(), for the fused range checks of TryAdd.
  int32_t limit_bits() const { return limit_bits_; }

 private:
  absl::Status CheckHeader(double weight, uint64_t spec_fingerprint, uint64_t num_values,
                           std::string_view source) const;
  // The error for values that TryAdd refused: names the first bad value and its tensor.
  absl::Status DescribeBadValues(std::span<const float> values, std::string_view source) const;
  void Count(double weight);

  // Range check, then the fixed norm bound, in place; false when a value is out of range (nothing scaled).
  bool ClipFixed(std::span<float> values);

  std::shared_ptr<const ModelSpec> spec_;
  float max_abs_value_ = kMaxUpdateAbsValue;
  int32_t limit_bits_ = std::bit_cast<int32_t>(kMaxUpdateAbsValue);
  std::string max_abs_value_source_;  // what set the bound, for the refusal ("--max-update-value")
  NormClip clip_;
  std::vector<double> norms_;  // kMedian: the norm of each accepted update, in order
  mutable size_t num_clipped_ = 0;
  size_t num_updates_ = 0;
  double total_weight_ = 0.0;
  std::vector<float> decode_scratch_;  // allocated on first use, kept across rounds
};

// sum_k w_k x_k / sum_k w_k, accumulated in fp32.
//
// Precision: the accumulator adds one rounding of at most 2^-24 relative per update, so with n updates
// and W = sum_k w_k, |error_i| <= n * 2^-24 * sum_k w_k |x_k,i| / W: about 6e-5 relative to the
// weighted mean of |x| for n = 1000. That is far below the error of any lossy codec (fp16 ~ 5e-4, int8 ~ 4e-3) and
// matches Streaming DiLoCo's "accumulation in fp32"; fp64 would double memory traffic on the server's hot loop for no
// visible gain. Overflow cannot happen (see kMaxUpdateAbsValue).
//
// Speed and memory: two accumulators of P floats, used in turn. Add makes ONE branch-free pass that
// range-checks x and writes next = acc + w * x into the spare one, then swaps them if x was good. The
// current sum is therefore never written before the whole update is known to be good (fp32 additions
// cannot be undone exactly), without reading the update twice: measured on one core, a check pass then
// an in-place acc += w * x ran at 0.4-0.7x memcpy, this at 0.5-0.9x. AddEncoded decodes straight into
// the spare accumulator, so the mean never holds more than 2P floats.
class WeightedMeanAggregator final : public Aggregator {
 public:
  explicit WeightedMeanAggregator(std::shared_ptr<const ModelSpec> spec);
  std::string name() const override { return "mean"; }

 private:
  bool TryAdd(std::span<const float> values, float weight) override;
  std::span<float> DecodeBuffer() override { return spare_; }
  void FinishInto(std::span<float> out) const override;
  void ResetState() override;

  std::vector<float> acc_;    // the running sum
  std::vector<float> spare_;  // scratch for the next sum; its contents mean nothing between calls
};

// Common part of the aggregators that keep every update (one row of P floats each). Rows are kept
// allocated across Reset for the next round.
class BufferingAggregator : public Aggregator {
 protected:
  explicit BufferingAggregator(std::shared_ptr<const ModelSpec> spec) : Aggregator(std::move(spec)) {}
  // Reduces one coordinate's n values (in any order; may be reordered in place) to the aggregate.
  virtual float Reduce(float* column, size_t n) const = 0;

 private:
  bool TryAdd(std::span<const float> values, float weight) override;
  std::span<float> DecodeBuffer() override;
  void FinishInto(std::span<float> out) const override;
  void ResetState() override { num_rows_ = 0; }
  bool KeepsUpdates() const override { return true; }
  std::vector<float>& NextRow();

  std::vector<std::vector<float>> rows_;
  size_t num_rows_ = 0;  // rows in use
};

// Coordinate-wise median (unweighted); for an even count, the mean of the two middle values.
class CoordinateMedianAggregator final : public BufferingAggregator {
 public:
  explicit CoordinateMedianAggregator(std::shared_ptr<const ModelSpec> spec) : BufferingAggregator(std::move(spec)) {}
  std::string name() const override { return "median"; }

 private:
  float Reduce(float* column, size_t n) const override;
};

// Coordinate-wise trimmed mean (unweighted): with n updates, k = floor(beta * n) values are dropped
// from each end and the remaining n - 2k are averaged (in double). k is computed as Flower / scipy's
// trim_mean do, int(beta * n), so results match theirs. beta in [0, 0.5); beta = 0 is the plain mean.
class TrimmedMeanAggregator final : public BufferingAggregator {
 public:
  // Use MakeTrimmedMeanAggregator or MakeAggregator to get beta validated.
  TrimmedMeanAggregator(std::shared_ptr<const ModelSpec> spec, double beta)
      : BufferingAggregator(std::move(spec)), beta_(beta) {}
  std::string name() const override;
  double beta() const { return beta_; }

 private:
  float Reduce(float* column, size_t n) const override;
  double beta_;
};

absl::StatusOr<std::unique_ptr<Aggregator>> MakeTrimmedMeanAggregator(std::shared_ptr<const ModelSpec> spec,
                                                                      double beta);

// An aggregator by name as written in configs: "mean" (alias "fedavg"), "median" (alias "fedmedian"),
// "trimmed_mean" (beta 0.2, Flower's default) or "trimmed_mean:<beta>" (alias "fedtrimmedavg").
absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view name,
                                                           std::shared_ptr<const ModelSpec> spec);

}  // namespace fl::core

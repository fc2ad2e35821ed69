#include "fl/core/aggregator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

// The range check used by every aggregator, on bit patterns: for non-negative IEEE floats the integer
// order of the bits is the numeric order, and NaN/Inf have the largest patterns of all, so one integer
// comparison per value checks finiteness and range together. `limit_bits - abs_bits` is negative exactly
// when abs_bits > limit_bits (both lie in [0, 2^31): no overflow), and OR-ing the differences keeps the
// sign bit of any negative one. kLanes independent accumulators let the compiler vectorize the loops
// with no branch inside: the check rides along with the pass that uses the values, at no extra read.
constexpr size_t kLanes = 16;
// `limit_bits` is the bit pattern of the aggregator's bound (Aggregator::SetMaxAbsValue), a positive finite float.
inline int32_t RangeBits(float x, int32_t limit_bits) { return limit_bits - (std::bit_cast<int32_t>(x) & 0x7fffffff); }

template <size_t N>
bool NoneNegative(const int32_t (&lanes)[N], int32_t tail) {
  int32_t any = tail;
  for (size_t j = 0; j < N; ++j) any |= lanes[j];
  return any >= 0;
}

// next[i] = acc[i] + weight * x[i]; true when every x[i] passed the range check.
bool FusedAccumulate(const float* __restrict x, const float* __restrict acc, float* __restrict next, size_t n,
                     float weight, int32_t limit_bits) {
  int32_t lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lanes[j] |= RangeBits(x[i + j], limit_bits);
      next[i + j] = acc[i + j] + weight * x[i + j];
    }
  }
  int32_t tail = 0;
  for (; i < n; ++i) {
    tail |= RangeBits(x[i], limit_bits);
    next[i] = acc[i] + weight * x[i];
  }
  return NoneNegative(lanes, tail);
}

// The same with x and next being one buffer (AddEncoded decodes into the spare accumulator): x_next[i] =
// acc[i] + weight * x_next[i]. A separate function because the restrict-qualified one must not alias.
bool FusedAccumulateInPlace(float* __restrict x_next, const float* __restrict acc, size_t n, float weight,
                            int32_t limit_bits) {
  int32_t lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lanes[j] |= RangeBits(x_next[i + j], limit_bits);
      x_next[i + j] = acc[i + j] + weight * x_next[i + j];
    }
  }
  int32_t tail = 0;
  for (; i < n; ++i) {
    tail |= RangeBits(x_next[i], limit_bits);
    x_next[i] = acc[i] + weight * x_next[i];
  }
  return NoneNegative(lanes, tail);
}

// dst[i] = x[i]; true when every x[i] passed the range check.
bool FusedCopy(const float* __restrict x, float* __restrict dst, size_t n, int32_t limit_bits) {
  int32_t lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lanes[j] |= RangeBits(x[i + j], limit_bits);
      dst[i + j] = x[i + j];
    }
  }
  int32_t tail = 0;
  for (; i < n; ++i) {
    tail |= RangeBits(x[i], limit_bits);
    dst[i] = x[i];
  }
  return NoneNegative(lanes, tail);
}

bool AllInRange(const float* x, size_t n, int32_t limit_bits) {
  int32_t lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] |= RangeBits(x[i + j], limit_bits);
  }
  int32_t tail = 0;
  for (; i < n; ++i) tail |= RangeBits(x[i], limit_bits);
  return NoneNegative(lanes, tail);
}

std::string Describe(std::string_view source) { return fl::StrCat("update from ", source); }

absl::Status Prefixed(const absl::Status& status, std::string_view source) {
  return absl::Status(status.code(), fl::StrCat(Describe(source), ": ", fl::ToStd(status.message())));
}

// Copies a block of `width` coordinates starting at `base` from every row into `columns`, one column of
// rows.size() values per coordinate: order statistics then work on contiguous memory, and each row is
// read sequentially. `scales` (one per row, or empty) scales each row's values (norm bounding).
void GatherColumns(const std::vector<std::vector<float>>& rows, size_t num_rows, size_t base, size_t width,
                   std::vector<float>& columns, const std::vector<float>& scales) {
  for (size_t k = 0; k < num_rows; ++k) {
    const float* row = rows[k].data() + base;
    const float scale = scales.empty() ? 1.0f : scales[k];
    if (scale == 1.0f) {
      for (size_t j = 0; j < width; ++j) columns[j * num_rows + k] = row[j];
    } else {
      for (size_t j = 0; j < width; ++j) columns[j * num_rows + k] = row[j] * scale;
    }
  }
}

// Scales the float tensors of `values` by `scale`; integer tensors (client-local counters) are left alone.
void ScaleFloatTensors(const ModelSpec& spec, std::span<float> values, float scale) {
  for (const TensorSpec& t : spec.tensors()) {
    if (IsIntegerDType(t.dtype)) continue;
    float* v = values.data() + t.offset;
    const uint64_t n = t.num_elements();
    for (uint64_t i = 0; i < n; ++i) v[i] *= scale;
  }
}

// Coordinates per block so that a block's columns stay within about 256 KiB (L2) whatever the count.
size_t BlockWidth(size_t num_rows) { return std::max<size_t>(16, (size_t{1} << 16) / std::max<size_t>(1, num_rows)); }

float MedianInPlace(float* v, size_t n) {
  const size_t mid = n / 2;
  std::nth_element(v, v + mid, v + n);
  if (n % 2 == 1) return v[mid];
  // Even count: the mean of the two middle values. The lower one is the largest of the lower half,
  // which nth_element left (unordered) in front of v[mid]. Averaged in double: cannot overflow.
  const float lower = *std::max_element(v, v + mid);
  return static_cast<float>((static_cast<double>(lower) + static_cast<double>(v[mid])) * 0.5);
}

float TrimmedMeanInPlace(float* v, size_t n, size_t trim) {
  if (trim > 0) {
    // Afterwards v[trim, n - trim) holds exactly the values of ranks trim .. n - trim - 1.
    std::nth_element(v, v + trim, v + n);
    std::nth_element(v + trim, v + (n - trim - 1), v + n);
  }
  double sum = 0.0;
  for (size_t i = trim; i < n - trim; ++i) sum += v[i];
  return static_cast<float>(sum / static_cast<double>(n - 2 * trim));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Norm bounding

absl::StatusOr<NormClip> NormClip::Parse(std::string_view text) {
  NormClip clip;
  if (text == "off" || text == "0") return clip;
  if (text == "median") {
    clip.mode = Mode::kMedian;
    return clip;
  }
  double bound = 0;
  if (!absl::SimpleAtod(absl::string_view(text.data(), text.size()), &bound) || !std::isfinite(bound) || bound <= 0) {
    return absl::InvalidArgumentError(
        fl::StrCat("update norm bound '", text, "' is invalid: write off, median, or a finite number > 0"));
  }
  clip.mode = Mode::kFixed;
  clip.max_norm = bound;
  return clip;
}

std::string NormClip::ToString() const {
  switch (mode) {
    case Mode::kOff: return "off";
    case Mode::kMedian: return "median";
    case Mode::kFixed: return fl::StrCat(max_norm);
  }
  return "off";
}

double UpdateNorm(const ModelSpec& spec, std::span<const float> values) {
  double sum = 0;
  for (const TensorSpec& t : spec.tensors()) {
    if (IsIntegerDType(t.dtype)) continue;
    const float* v = values.data() + t.offset;
    const uint64_t n =
        std::min<uint64_t>(t.num_elements(), values.size() - std::min<uint64_t>(t.offset, values.size()));
    for (uint64_t i = 0; i < n; ++i) sum += static_cast<double>(v[i]) * static_cast<double>(v[i]);
  }
  return std::sqrt(sum);
}

// ---------------------------------------------------------------------------------------------------------
// Aggregator

Aggregator::Aggregator(std::shared_ptr<const ModelSpec> spec) : spec_(std::move(spec)) {}

absl::Status Aggregator::SetNormClip(NormClip clip) {
  if (clip.mode == NormClip::Mode::kFixed && !(std::isfinite(clip.max_norm) && clip.max_norm > 0)) {
    return absl::InvalidArgumentError(fl::StrCat("update norm bound ", clip.max_norm, " must be finite and > 0"));
  }
  if (clip.mode == NormClip::Mode::kMedian && !KeepsUpdates()) {
    return absl::InvalidArgumentError(
        fl::StrCat("the '", name(),
                   "' aggregator streams its updates and cannot bound them by the median norm of the "
                   "round; give a fixed bound (a number) or use a robust aggregator (median, trimmed_mean)"));
  }
  clip_ = clip;
  return absl::OkStatus();
}

absl::Status Aggregator::SetMaxAbsValue(double limit, std::string source) {
  // Written so that NaN fails it too.
  if (!(limit > 0 && limit <= kMaxUpdateAbsValue)) {
    return absl::InvalidArgumentError(fl::StrCat("the bound on update values ", limit, " must be in (0, ",
                                                 kMaxUpdateAbsValue,
                                                 "] (2^64: the fp32 sum is proven overflow-free "
                                                 "up to that)"));
  }
  max_abs_value_ = static_cast<float>(limit);
  limit_bits_ = std::bit_cast<int32_t>(max_abs_value_);
  max_abs_value_source_ = std::move(source);
  return absl::OkStatus();
}

bool Aggregator::ClipFixed(std::span<float> values) {
  // Range first, so that a value beyond max_abs_value() is refused rather than scaled into range.
  if (!AllInRange(values.data(), values.size(), limit_bits_)) return false;
  const double norm = UpdateNorm(*spec_, values);
  if (norm > clip_.max_norm) {
    ScaleFloatTensors(*spec_, values, static_cast<float>(clip_.max_norm / norm));
    ++num_clipped_;
  }
  return true;
}

absl::Status Aggregator::CheckHeader(double weight, uint64_t spec_fingerprint, uint64_t num_values,
                                     std::string_view source) const {
  if (absl::Status s = CheckMatchesSpec(*spec_, spec_fingerprint, num_values, Describe(source)); !s.ok()) {
    return s;
  }
  // Written so that NaN fails it too.
  if (!(weight >= kMinUpdateWeight && weight <= kMaxUpdateWeight)) {
    return absl::InvalidArgumentError(
        fl::StrCat(Describe(source), " has weight ", weight, "; a weight must be finite and in [", kMinUpdateWeight,
                   ", ", kMaxUpdateWeight, "] (use the client's example count, or 1 for equal weights)"));
  }
  if (num_updates_ >= kMaxUpdatesPerAggregate) {
    return absl::ResourceExhaustedError(
        fl::StrCat(Describe(source), " is refused: this aggregate already holds ", num_updates_,
                   " updates, the most one aggregate takes (the fp32 sum is only proven overflow-free up to that); "
                   "call Finish and start a new aggregate"));
  }
  return absl::OkStatus();
}

absl::Status Aggregator::DescribeBadValues(std::span<const float> values, std::string_view source) const {
  const std::string what = Describe(source);
  if (absl::Status s = CheckFinite(values, what, spec_.get()); !s.ok()) return s;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::fabs(values[i]) <= max_abs_value_) continue;
    const TensorSpec& t = spec_->tensors()[spec_->TensorIndexOfElement(i)];
    return absl::InvalidArgumentError(fl::StrCat(
        what, " contains ", values[i], " at tensor '", t.name, "' element ", i - t.offset, "; values beyond +-",
        max_abs_value_, max_abs_value_source_.empty() ? std::string() : fl::StrCat(" (", max_abs_value_source_, ")"),
        " are never aggregated: the client's training diverged"));
  }
  return absl::InternalError(fl::StrCat(what, " was refused but holds no out-of-range value"));
}

void Aggregator::Count(double weight) {
  ++num_updates_;
  total_weight_ += weight;
}

std::span<float> Aggregator::DecodeBuffer() {
  decode_scratch_.resize(spec_->num_elements());
  return decode_scratch_;
}

absl::Status Aggregator::Add(std::span<const float> values, double weight, uint64_t spec_fingerprint,
                             std::string_view source) {
  if (absl::Status s = CheckHeader(weight, spec_fingerprint, values.size(), source); !s.ok()) return s;
  if (clip_.mode == NormClip::Mode::kFixed) {
    // Bounded in a copy: the caller's values are const. The copy goes where AddEncoded would decode to.
    std::span<float> buffer = DecodeBuffer();
    std::copy(values.begin(), values.end(), buffer.begin());
    if (!ClipFixed(buffer) || !TryAdd(buffer, static_cast<float>(weight))) return DescribeBadValues(values, source);
  } else {
    if (!TryAdd(values, static_cast<float>(weight))) return DescribeBadValues(values, source);
    if (clip_.mode == NormClip::Mode::kMedian) norms_.push_back(UpdateNorm(*spec_, values));
  }
  Count(weight);
  return absl::OkStatus();
}

absl::Status Aggregator::AddEncoded(const Codec& codec, std::span<const uint8_t> payload, double weight,
                                    uint64_t spec_fingerprint, std::string_view source, const DecodeOptions& options) {
  // The header says how many values the payload holds: check it against the model before decoding so
  // that a wrong-sized update gets the same error as through Add.
  absl::StatusOr<PayloadInfo> info = PeekPayload(payload);
  if (!info.ok()) return Prefixed(info.status(), source);
  if (info->kind != codec.kind()) {
    return absl::InvalidArgumentError(fl::StrCat(Describe(source), " is a '", CodecKindName(info->kind),
                                                 "' payload but was handed to the '", codec.name(),
                                                 "' codec; pick the codec with PeekPayload"));
  }
  // fp32 over a verified transfer: the body is the update's floats as they are (little-endian, as this host
  // stores them), so it is added in place, one pass fewer than decoding a copy of 4P bytes first. Add's range
  // check (NaN, Inf, beyond max_abs_value()) covers the decoder's finite check; the body checksum is what the
  // transfer checksum already verified; Add checks the weight, fingerprint and size. A body not aligned for floats
  // takes the decoding path.
  const uint8_t* body = payload.data() + kCodecHeaderBytes;
  if (info->kind == CodecKind::kFp32 && options.transfer_verified && std::endian::native == std::endian::little &&
      reinterpret_cast<uintptr_t>(body) % alignof(float) == 0) {
    return Add(std::span<const float>(reinterpret_cast<const float*>(body), info->num_values), weight, spec_fingerprint,
               source);
  }
  if (absl::Status s = CheckHeader(weight, spec_fingerprint, info->num_values, source); !s.ok()) return s;
  // Decode, then add exactly as Add does (rather than DecodeAccumulate into the sum): decoded values are
  // finite but may still exceed max_abs_value() (an fp32 or bf16 payload can carry 1e38), and the
  // range check must pass before anything touches the aggregate.
  std::span<float> buffer = DecodeBuffer();
  if (absl::Status s = codec.Decode(payload, buffer, options); !s.ok()) return Prefixed(s, source);
  // kMedian: the norm of the decoded update (kept as it is in the row: TryAdd of a buffering aggregator
  // only checks it); a refused update's norm is dropped below.
  const double norm = clip_.mode == NormClip::Mode::kMedian ? UpdateNorm(*spec_, buffer) : 0.0;
  const bool in_range = clip_.mode != NormClip::Mode::kFixed || ClipFixed(buffer);
  if (!in_range || !TryAdd(buffer, static_cast<float>(weight))) {
    // TryAdd may have overwritten the decoded values (the mean reuses them); decode again to say which
    // value was out of range. Rare: only a payload with values beyond the bound gets here.
    buffer = DecodeBuffer();
    if (absl::Status s = codec.Decode(payload, buffer, options); !s.ok()) return Prefixed(s, source);
    return DescribeBadValues(buffer, source);
  }
  if (clip_.mode == NormClip::Mode::kMedian) norms_.push_back(norm);
  Count(weight);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Aggregator::Finish() const {
  if (num_updates_ == 0) {
    return absl::FailedPreconditionError(
        fl::StrCat("cannot finish a '", name(), "' aggregate with no accepted updates (model fingerprint ",
                   spec_->FingerprintHex(), "); check why every client's update was rejected or missing"));
  }
  row_scales_.clear();
  if (clip_.mode == NormClip::Mode::kMedian) {
    // The bound is the median norm of the round's updates: at least half of them are left as they are,
    // and none can pull harder than a typical one.
    std::vector<double> sorted = norms_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double bound = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    num_clipped_ = 0;
    for (double norm : norms_) {
      const bool clip = norm > bound && norm > 0;
      row_scales_.push_back(clip ? static_cast<float>(bound / norm) : 1.0f);
      num_clipped_ += clip;
    }
  }
  std::vector<float> out(spec_->num_elements());
  FinishInto(out);
  return out;
}

void Aggregator::Reset() {
  num_updates_ = 0;
  total_weight_ = 0.0;
  norms_.clear();
  row_scales_.clear();
  num_clipped_ = 0;
  ResetState();
}

// ---------------------------------------------------------------------------------------------------------
// WeightedMeanAggregator

WeightedMeanAggregator::WeightedMeanAggregator(std::shared_ptr<const ModelSpec> spec)
    : Aggregator(std::move(spec)), acc_(this->spec().num_elements(), 0.0f), spare_(this->spec().num_elements(), 0.0f) {}

bool WeightedMeanAggregator::TryAdd(std::span<const float> values, float weight) {
  const bool ok = values.data() == spare_.data()
                      ? FusedAccumulateInPlace(spare_.data(), acc_.data(), acc_.size(), weight, limit_bits())
                      : FusedAccumulate(values.data(), acc_.data(), spare_.data(), acc_.size(), weight, limit_bits());
  if (ok) acc_.swap(spare_);  // swaps the buffers' pointers, not their contents
  return ok;
}

void WeightedMeanAggregator::FinishInto(std::span<float> out) const {
  // Divided in double: W is a sum of doubles, and 1/W in fp32 would add a rounding for nothing.
  const double inv_total = 1.0 / total_weight();
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(static_cast<double>(acc_[i]) * inv_total);
}

void WeightedMeanAggregator::ResetState() { std::fill(acc_.begin(), acc_.end(), 0.0f); }

// ---------------------------------------------------------------------------------------------------------
// BufferingAggregator and its reductions

std::vector<float>& BufferingAggregator::NextRow() {
  if (num_rows_ == rows_.size()) rows_.emplace_back();
  std::vector<float>& row = rows_[num_rows_];
  row.resize(spec().num_elements());
  return row;
}

std::span<float> BufferingAggregator::DecodeBuffer() { return NextRow(); }

bool BufferingAggregator::TryAdd(std::span<const float> values, float /*weight*/) {
  std::vector<float>& row = NextRow();
  // Decoded straight into the row by AddEncoded: only the check is left to do.
  const bool ok = values.data() == row.data() ? AllInRange(row.data(), row.size(), limit_bits())
                                              : FusedCopy(values.data(), row.data(), row.size(), limit_bits());
  if (ok) ++num_rows_;  // a refused row stays unused, to be overwritten by the next update
  return ok;
}

void BufferingAggregator::FinishInto(std::span<float> out) const {
  const size_t n = num_rows_;
  const size_t block = BlockWidth(n);
  std::vector<float> columns(block * n);
  // Norm bounding (kMedian) scales the float tensors only: integer tensors are gathered again unscaled.
  std::vector<std::pair<uint64_t, uint64_t>> integer_ranges;
  if (!row_scales_.empty()) {
    for (const TensorSpec& t : spec().tensors()) {
      if (IsIntegerDType(t.dtype)) integer_ranges.emplace_back(t.offset, t.offset + t.num_elements());
    }
  }
  for (size_t base = 0; base < out.size(); base += block) {
    const size_t width = std::min(block, out.size() - base);
    GatherColumns(rows_, n, base, width, columns, row_scales_);
    for (const auto& [begin, end] : integer_ranges) {
      for (uint64_t i = std::max<uint64_t>(begin, base); i < std::min<uint64_t>(end, base + width); ++i) {
        for (size_t k = 0; k < n; ++k) columns[(i - base) * n + k] = rows_[k][i];
      }
    }
    for (size_t j = 0; j < width; ++j) out[base + j] = Reduce(&columns[j * n], n);
  }
}

float CoordinateMedianAggregator::Reduce(float* column, size_t n) const { return MedianInPlace(column, n); }

std::string TrimmedMeanAggregator::name() const { return fl::StrCat("trimmed_mean:", beta_); }

float TrimmedMeanAggregator::Reduce(float* column, size_t n) const {
  // As Flower's _trim_mean / scipy.stats.trim_mean: int(proportiontocut * nobs). beta < 0.5 keeps at
  // least one value.
  const size_t trim = static_cast<size_t>(beta_ * static_cast<double>(n));
  return TrimmedMeanInPlace(column, n, trim);
}

// ---------------------------------------------------------------------------------------------------------
// Factories

absl::StatusOr<std::unique_ptr<Aggregator>> MakeTrimmedMeanAggregator(std::shared_ptr<const ModelSpec> spec,
                                                                      double beta) {
  if (!(beta >= 0.0 && beta < 0.5)) {
    return absl::InvalidArgumentError(
        fl::StrCat("trimmed mean fraction beta = ", beta,
                   " is out of range; beta is the fraction cut from EACH end and must be in [0, 0.5) (Flower's "
                   "default is 0.2)"));
  }
  return std::make_unique<TrimmedMeanAggregator>(std::move(spec), beta);
}

absl::StatusOr<std::unique_ptr<Aggregator>> MakeAggregator(std::string_view name,
                                                           std::shared_ptr<const ModelSpec> spec) {
  if (spec == nullptr) return absl::InvalidArgumentError("MakeAggregator needs a model spec, got null");
  const size_t colon = name.find(':');
  const std::string_view kind = name.substr(0, colon);
  const bool has_param = colon != std::string_view::npos;
  const std::string_view param = has_param ? name.substr(colon + 1) : std::string_view();

  if (kind == "trimmed_mean" || kind == "fedtrimmedavg") {
    double beta = 0.2;  // Flower FedTrimmedAvg's default
    if (has_param && !absl::SimpleAtod(absl::string_view(param.data(), param.size()), &beta)) {
      return absl::InvalidArgumentError(
          fl::StrCat("aggregator '", name, "': '", param, "' is not a number; write e.g. trimmed_mean:0.2"));
    }
    return MakeTrimmedMeanAggregator(std::move(spec), beta);
  }
  if (has_param && (kind == "mean" || kind == "fedavg" || kind == "median" || kind == "fedmedian")) {
    return absl::InvalidArgumentError(
        fl::StrCat("aggregator '", name, "': '", kind, "' takes no parameter; drop ':", param, "'"));
  }
  if (kind == "mean" || kind == "fedavg") return std::make_unique<WeightedMeanAggregator>(std::move(spec));
  if (kind == "median" || kind == "fedmedian") {
    return std::make_unique<CoordinateMedianAggregator>(std::move(spec));
  }
  return absl::InvalidArgumentError(
      fl::StrCat("unknown aggregator '", name,
                 "'; expected one of: mean (fedavg), median (fedmedian), trimmed_mean[:beta] (fedtrimmedavg)"));
}

}  // namespace fl::core

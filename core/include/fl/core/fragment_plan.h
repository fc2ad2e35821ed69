// Fragment plans and schedules for Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512).
//
// Streaming DiLoCo splits the model into P fragments (groups of layers) and syncs one fragment at a time,
// staggered, so that peak bandwidth drops by about P while every parameter still syncs once per H inner
// steps. This file says WHICH tensors form each fragment (FragmentPlan) and WHEN each syncs
// (FragmentSchedule); moving the bytes is the client's and server's business.
//
// Layers. A tensor belongs to the layer named by its name up to and including the first dot-separated
// component made only of digits: "blocks.3.attn.w" -> layer "blocks.3" (index 3), "model.layers.10.mlp.w"
// -> "model.layers.10". Tensors with no such component (embeddings, final norm, head) are NON-LAYER and
// get a fragment of their own, as in the paper. Keying layers by the whole prefix rather than the number
// alone keeps "layer1.0" and "layer2.0" (ResNet stages) or "encoder.layers.0" and "decoder.layers.0"
// apart; for the usual single stack ("blocks.N", "layers.N", "h.N") it is exactly "layer N". Layers are
// ordered by the first appearance of their prefix in the spec, then by number (so a spec sorted
// alphabetically, "blocks.10" before "blocks.2", still orders blocks numerically), and a layer's POSITION
// is its rank in that order: 0..N-1.
//
// Counting. num_fragments (P) is the total, non-layer fragment included:
//   - P = 1: a single fragment holds the whole model (plain DiLoCo).
//   - P >= 2 and the model has non-layer tensors: fragments 0..P-2 hold the layers (L = P - 1 layer
//     fragments) and fragment P-1 holds every non-layer tensor. Last, so that it syncs at the end of
//     each round of H steps, aligned with round boundaries.
//   - P >= 2 and no non-layer tensor: all P fragments hold layers (L = P).
// Errors: P < 1; fewer distinct layers than L (a fragment would be empty); P >= 2 with no layer tensors.
//
// Strategies (layer position i, L layer fragments, N layers):
//   - strided:    i -> i mod L                       (the paper found it slightly better)
//   - sequential: i -> the g with floor(g N / L) <= i < floor((g+1) N / L): contiguous groups whose
//                 layer counts differ by at most one.
//   - balanced:   not by layers but by size: whole TENSORS (non-layer ones included, no fragment of its
//                 own) spread over all P fragments, largest first, each to the fragment holding the fewest
//                 values so far. The layer strategies cut peak bytes per sync by less than P when layers
//                 and the non-layer group differ in size (3 transformer blocks + small embeddings at P = 4:
//                 3.3x); balanced fragments hold about 1/P of the model each, so the peak falls by about P.
//                 A fragment may then hold part of a layer: its `layers` lists every layer it touches.
//                 Error: fewer non-empty tensors than P.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"

namespace fl::core {

enum class FragmentStrategy : uint8_t { kStrided = 0, kSequential = 1, kBalanced = 2 };

std::string_view FragmentStrategyName(FragmentStrategy strategy);  // "strided", "sequential", "balanced"
absl::StatusOr<FragmentStrategy> ParseFragmentStrategy(std::string_view name);

// The first purely numeric dot-separated component of `tensor_name` ("blocks.3.attn.w" -> 3), or nullopt
// when there is none (or it does not fit in 64 bits).
std::optional<uint64_t> LayerIndexOf(std::string_view tensor_name);
// The name up to and including that component ("blocks.3.attn.w" -> "blocks.3"); empty when none.
std::string_view LayerKeyOf(std::string_view tensor_name);

struct ElementRange {
  uint64_t offset = 0;  // in elements of the model's flat buffer
  uint64_t num_elements = 0;
};

struct Fragment {
  size_t index = 0;
  bool holds_non_layer = false;        // holds tensors without a layer (all of them, but with kBalanced)
  std::vector<std::string> layers;     // layer keys in layer order, e.g. {"blocks.0", "blocks.4"} (touched)
  std::vector<size_t> tensor_indices;  // indices into the model spec, ascending
  // Where the fragment's values lie in the model's flat buffer: ascending, non-empty, adjacent tensors
  // merged. Gather concatenates them in this order.
  std::vector<ElementRange> ranges;
  uint64_t num_elements = 0;
  // The fragment's own spec: its tensors (names, shapes, dtypes) in model order with offsets from 0.
  // Gathered values are laid out by it, and its fingerprint tags a fragment's updates, so that an
  // Aggregator built on it checks them like whole-model updates.
  std::shared_ptr<const ModelSpec> spec;
};

class FragmentPlan {
 public:
  static absl::StatusOr<FragmentPlan> Create(const ModelSpec& model, size_t num_fragments, FragmentStrategy strategy);

  FragmentStrategy strategy() const { return strategy_; }
  size_t num_fragments() const { return fragments_.size(); }
  const std::vector<Fragment>& fragments() const { return fragments_; }
  const Fragment& fragment(size_t index) const { return fragments_.at(index); }
  // Number of distinct layers found in the model.
  size_t num_layers() const { return num_layers_; }
  // The fragment holding tensor `tensor_index` of the model spec.
  size_t FragmentOfTensor(size_t tensor_index) const { return fragment_of_tensor_.at(tensor_index); }
  uint64_t model_fingerprint() const { return model_fingerprint_; }
  uint64_t model_num_elements() const { return model_num_elements_; }

  // Copies fragment `index`'s values out of a whole-model buffer into `out` (fragment(index).num_elements
  // values, laid out as fragment(index).spec).
  absl::Status Gather(size_t index, std::span<const float> model_values, std::span<float> out) const;
  // The reverse: writes a fragment's values into their places in a whole-model buffer.
  absl::Status Scatter(size_t index, std::span<const float> fragment_values, std::span<float> model_values) const;

  // One line per fragment, for logs: "fragment 0: 3 layers (blocks.0, blocks.2, blocks.4), 9 tensors,
  // 1234 elements".
  std::string Describe() const;

 private:
  static absl::StatusOr<FragmentPlan> CreateBalanced(const ModelSpec& model, size_t num_fragments,
                                                     const std::vector<std::string>& tensor_layer,
                                                     const std::vector<std::string>& layers);
  // Fills tensor_indices, ranges, num_elements and spec of every fragment from tensor -> fragment.
  absl::Status AssignTensors(const ModelSpec& model, std::vector<size_t> fragment_of_tensor);
  absl::Status CheckSizes(size_t index, size_t model_size, size_t fragment_size, std::string_view op) const;

  FragmentStrategy strategy_ = FragmentStrategy::kStrided;
  std::vector<Fragment> fragments_;
  std::vector<size_t> fragment_of_tensor_;
  size_t num_layers_ = 0;
  uint64_t model_fingerprint_ = 0;
  uint64_t model_num_elements_ = 0;
};

// When fragments sync. Inner steps are counted from 1 and "step t" means "after the t-th inner step"
// (t = 0 is the start, before any training). With H inner steps per round and P fragments, fragment f
// starts its exchange at every step t >= 1 with
//     t mod H == ((f + 1) * H / P) mod H,
// i.e. one fragment every H/P steps, in order 0, 1, ..., P-1, each once per H steps; fragment P-1 at
// multiples of H. H must be divisible by P. With overlap tau (the paper's tau; torchft's
// fragment_sync_delay), an exchange started at step t is applied at step t + tau: the worker keeps
// training for tau steps while the bytes travel. tau < H/P (as torchft requires), so at most one exchange
// is in flight at a time and it lands before the next one starts; tau = 0 is the blocking case.
class FragmentSchedule {
 public:
  static absl::StatusOr<FragmentSchedule> Create(uint64_t inner_steps_per_round, size_t num_fragments,
                                                 uint64_t overlap_steps);

  uint64_t inner_steps_per_round() const { return inner_steps_per_round_; }  // H
  size_t num_fragments() const { return num_fragments_; }                    // P
  uint64_t overlap_steps() const { return overlap_steps_; }                  // tau
  uint64_t steps_between_syncs() const { return steps_between_syncs_; }      // H / P

  // The fragment whose exchange starts at `step`, if any (at most one).
  std::optional<size_t> FragmentSyncingAt(uint64_t step) const;
  // The step at which an exchange started at `send_step` is applied: send_step + tau.
  uint64_t ApplyStep(uint64_t send_step) const { return send_step + overlap_steps_; }
  // The fragment whose exchange (started at step - tau) is applied at `step`, if any (at most one).
  std::optional<size_t> FragmentApplyingAt(uint64_t step) const;
  // The step at which fragment `fragment` starts its exchange in round `round` (from 0):
  // round * H + (fragment + 1) * H / P. Requires fragment < P.
  uint64_t SendStep(size_t fragment, uint64_t round) const;
  // The first step > `after_step` at which `fragment` starts an exchange. Requires fragment < P.
  uint64_t NextSendStep(size_t fragment, uint64_t after_step) const;

 private:
  uint64_t inner_steps_per_round_ = 1;
  size_t num_fragments_ = 1;
  uint64_t overlap_steps_ = 0;
  uint64_t steps_between_syncs_ = 1;
};

}  // namespace fl::core

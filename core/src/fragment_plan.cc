#include "fl/core/fragment_plan.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>

#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

struct LayerComponent {
  size_t key_end = 0;     // the layer key is name[0, key_end)
  size_t prefix_end = 0;  // the prefix (components before the numeric one) is name[0, prefix_end)
  uint64_t index = 0;
};

std::optional<LayerComponent> FindLayerComponent(std::string_view name) {
  size_t begin = 0;
  while (begin <= name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string_view::npos) end = name.size();
    const std::string_view component = name.substr(begin, end - begin);
    const bool all_digits = !component.empty() && std::all_of(component.begin(), component.end(),
                                                              [](char c) { return c >= '0' && c <= '9'; });
    if (all_digits) {
      uint64_t value = 0;
      auto [ptr, ec] = std::from_chars(component.data(), component.data() + component.size(), value);
      if (ec == std::errc() && ptr == component.data() + component.size()) {
        return LayerComponent{end, begin == 0 ? 0 : begin - 1, value};
      }
    }
    begin = end + 1;
  }
  return std::nullopt;
}

std::string JoinFirst(const std::vector<std::string>& items, size_t max_items) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) out += fl::StrCat(i == 0 ? "" : ", ", items[i]);
  if (items.size() > max_items) out += fl::StrCat(", ... (", items.size(), " in all)");
  return out;
}

}  // namespace

std::string_view FragmentStrategyName(FragmentStrategy strategy) {
  switch (strategy) {
    case FragmentStrategy::kStrided: return "strided";
    case FragmentStrategy::kSequential: return "sequential";
    case FragmentStrategy::kBalanced: return "balanced";
  }
  return "unknown";
}

absl::StatusOr<FragmentStrategy> ParseFragmentStrategy(std::string_view name) {
  if (name == "strided") return FragmentStrategy::kStrided;
  if (name == "sequential") return FragmentStrategy::kSequential;
  if (name == "balanced") return FragmentStrategy::kBalanced;
  return absl::InvalidArgumentError(
      fl::StrCat("unknown fragment strategy '", name,
                 "'; expected 'strided' (layer i -> fragment i mod L, the "
                 "Streaming DiLoCo paper's better one), 'sequential' (contiguous groups of layers) or 'balanced' "
                 "(whole tensors spread so that fragments hold about equal numbers of values)"));
}

std::optional<uint64_t> LayerIndexOf(std::string_view tensor_name) {
  std::optional<LayerComponent> c = FindLayerComponent(tensor_name);
  if (!c.has_value()) return std::nullopt;
  return c->index;
}

std::string_view LayerKeyOf(std::string_view tensor_name) {
  std::optional<LayerComponent> c = FindLayerComponent(tensor_name);
  if (!c.has_value()) return {};
  return tensor_name.substr(0, c->key_end);
}

// ---------------------------------------------------------------------------------------------------------
// FragmentPlan

absl::StatusOr<FragmentPlan> FragmentPlan::Create(const ModelSpec& model, size_t num_fragments,
                                                  FragmentStrategy strategy) {
  if (num_fragments < 1) {
    return absl::InvalidArgumentError(
        "num_fragments = 0; it must be at least 1 (1 syncs the whole model at once, as plain DiLoCo)");
  }
  if (model.num_tensors() == 0) {
    return absl::InvalidArgumentError("cannot plan fragments for a model with no tensors");
  }
  const std::vector<TensorSpec>& tensors = model.tensors();

  // Find the layers: key -> (rank of its prefix by first appearance, layer number).
  struct LayerInfo {
    size_t prefix_rank;
    uint64_t number;
  };
  std::unordered_map<std::string, size_t> prefix_rank;
  std::map<std::string, LayerInfo> layer_info;
  std::vector<std::string> tensor_layer(tensors.size());  // empty for non-layer tensors
  std::vector<std::string> non_layer_names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = tensors[i].name;
    std::optional<LayerComponent> c = FindLayerComponent(name);
    if (!c.has_value()) {
      non_layer_names.push_back(name);
      continue;
    }
    const std::string prefix = name.substr(0, c->prefix_end);
    const size_t rank = prefix_rank.emplace(prefix, prefix_rank.size()).first->second;
    tensor_layer[i] = name.substr(0, c->key_end);
    layer_info.emplace(tensor_layer[i], LayerInfo{rank, c->index});
  }
  std::vector<std::string> layers;
  layers.reserve(layer_info.size());
  for (const auto& [key, info] : layer_info) layers.push_back(key);
  std::sort(layers.begin(), layers.end(), [&](const std::string& a, const std::string& b) {
    const LayerInfo& ia = layer_info.at(a);
    const LayerInfo& ib = layer_info.at(b);
    return std::tie(ia.prefix_rank, ia.number, a) < std::tie(ib.prefix_rank, ib.number, b);
  });
  const size_t num_layers = layers.size();
  const bool has_non_layer = !non_layer_names.empty();
  if (strategy == FragmentStrategy::kBalanced) {
    return CreateBalanced(model, num_fragments, tensor_layer, layers);
  }

  // How many fragments hold layers, and which one holds the non-layer tensors.
  size_t num_layer_fragments = 0;
  size_t non_layer_fragment = 0;
  if (num_fragments == 1) {
    num_layer_fragments = num_layers == 0 ? 0 : 1;
    non_layer_fragment = 0;
  } else if (num_layers == 0) {
    return absl::InvalidArgumentError(fl::StrCat("cannot split the model into ", num_fragments,
                                                 " fragments: no tensor name has a layer index (a purely "
                                                 "numeric component such as the 3 in 'blocks.3.attn.weight'; tensors: ",
                                                 JoinFirst(non_layer_names, 4), "); use num_fragments = 1"));
  } else {
    num_layer_fragments = has_non_layer ? num_fragments - 1 : num_fragments;
    non_layer_fragment = num_fragments - 1;
    if (num_layers < num_layer_fragments) {
      const size_t max_fragments = num_layers + (has_non_layer ? 1 : 0);
      return absl::InvalidArgumentError(fl::StrCat(
          "cannot split the model into ", num_fragments, " fragments: it has ", num_layers, " layers (",
          JoinFirst(layers, 4), ")",
          has_non_layer ? fl::StrCat(" plus non-layer tensors (", JoinFirst(non_layer_names, 3),
                                     ") that take a fragment of their own")
                        : std::string(),
          ", so at most ", max_fragments, " fragments can each hold something; use num_fragments <= ", max_fragments));
    }
  }

  // Layer position -> fragment.
  std::unordered_map<std::string, size_t> fragment_of_layer;
  for (size_t i = 0; i < num_layers; ++i) {
    size_t f = 0;
    if (num_layer_fragments > 1) {
      if (strategy == FragmentStrategy::kStrided) {
        f = i % num_layer_fragments;
      } else {
        // The g with floor(g N / L) <= i < floor((g + 1) N / L): the largest g with floor(g N / L) <= i.
        f = ((i + 1) * num_layer_fragments - 1) / num_layers;
      }
    }
    fragment_of_layer.emplace(layers[i], f);
  }

  FragmentPlan plan;
  plan.strategy_ = strategy;
  plan.num_layers_ = num_layers;
  plan.model_fingerprint_ = model.fingerprint();
  plan.model_num_elements_ = model.num_elements();
  plan.fragments_.resize(num_fragments);
  for (size_t f = 0; f < num_fragments; ++f) plan.fragments_[f].index = f;
  if (has_non_layer) plan.fragments_[non_layer_fragment].holds_non_layer = true;
  for (const std::string& layer : layers) plan.fragments_[fragment_of_layer.at(layer)].layers.push_back(layer);

  std::vector<size_t> fragment_of_tensor(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    fragment_of_tensor[i] = tensor_layer[i].empty() ? non_layer_fragment : fragment_of_layer.at(tensor_layer[i]);
  }
  if (absl::Status s = plan.AssignTensors(model, std::move(fragment_of_tensor)); !s.ok()) return s;
  return plan;
}

absl::Status FragmentPlan::AssignTensors(const ModelSpec& model, std::vector<size_t> fragment_of_tensor) {
  const std::vector<TensorSpec>& tensors = model.tensors();
  fragment_of_tensor_ = std::move(fragment_of_tensor);
  for (size_t i = 0; i < tensors.size(); ++i) {
    Fragment& fragment = fragments_[fragment_of_tensor_[i]];
    fragment.tensor_indices.push_back(i);
    const uint64_t n = tensors[i].num_elements();
    fragment.num_elements += n;
    if (n == 0) continue;
    if (!fragment.ranges.empty() &&
        fragment.ranges.back().offset + fragment.ranges.back().num_elements == tensors[i].offset) {
      fragment.ranges.back().num_elements += n;
    } else {
      fragment.ranges.push_back(ElementRange{tensors[i].offset, n});
    }
  }
  for (Fragment& fragment : fragments_) {
    std::vector<TensorSpec> fragment_tensors;
    fragment_tensors.reserve(fragment.tensor_indices.size());
    for (size_t i : fragment.tensor_indices) fragment_tensors.push_back(tensors[i]);
    absl::StatusOr<ModelSpec> spec = ModelSpec::Create(std::move(fragment_tensors));
    if (!spec.ok()) return spec.status();  // cannot happen: the model's own tensors already passed
    fragment.spec = std::make_shared<const ModelSpec>(*std::move(spec));
  }
  return absl::OkStatus();
}

absl::StatusOr<FragmentPlan> FragmentPlan::CreateBalanced(const ModelSpec& model, size_t num_fragments,
                                                          const std::vector<std::string>& tensor_layer,
                                                          const std::vector<std::string>& layers) {
  const std::vector<TensorSpec>& tensors = model.tensors();
  // Largest tensors first, each to the fragment holding the fewest values so far (ties: lower index), the
  // classic longest-processing-time rule: the largest fragment is at most 4/3 of the optimum and, for
  // models made of many tensors smaller than a fragment, within one tensor of the mean. Deterministic, so
  // every island derives the same plan from the same spec.
  std::vector<size_t> order;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].num_elements() > 0) order.push_back(i);
  }
  if (order.size() < num_fragments) {
    return absl::InvalidArgumentError(
        fl::StrCat("cannot split the model into ", num_fragments, " balanced fragments: it has only ", order.size(),
                   " non-empty tensors and every fragment needs at least one; use num_fragments <= ", order.size()));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].num_elements() > tensors[b].num_elements(); });
  std::vector<uint64_t> load(num_fragments, 0);
  std::vector<size_t> fragment_of_tensor(tensors.size(), 0);  // empty tensors ride with fragment 0
  for (size_t i : order) {
    const size_t f = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    fragment_of_tensor[i] = f;
    load[f] += tensors[i].num_elements();
  }

  FragmentPlan plan;
  plan.strategy_ = FragmentStrategy::kBalanced;
  plan.num_layers_ = layers.size();
  plan.model_fingerprint_ = model.fingerprint();
  plan.model_num_elements_ = model.num_elements();
  plan.fragments_.resize(num_fragments);
  for (size_t f = 0; f < num_fragments; ++f) plan.fragments_[f].index = f;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Fragment& fragment = plan.fragments_[fragment_of_tensor[i]];
    if (tensor_layer[i].empty()) fragment.holds_non_layer = true;
  }
  // A fragment's layers: every layer with at least one tensor in it, in layer order.
  for (const std::string& layer : layers) {
    std::vector<bool> seen(num_fragments, false);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensor_layer[i] == layer && !seen[fragment_of_tensor[i]]) {
        seen[fragment_of_tensor[i]] = true;
        plan.fragments_[fragment_of_tensor[i]].layers.push_back(layer);
      }
    }
  }
  if (absl::Status s = plan.AssignTensors(model, std::move(fragment_of_tensor)); !s.ok()) return s;
  return plan;
}

absl::Status FragmentPlan::CheckSizes(size_t index, size_t model_size, size_t fragment_size,
                                      std::string_view op) const {
  if (index >= fragments_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat(op, ": fragment ", index, " does not exist; the plan has ", fragments_.size(), " fragments"));
  }
  if (model_size != model_num_elements_) {
    return absl::InvalidArgumentError(fl::StrCat(op, " fragment ", index, ": the model buffer has ", model_size,
                                                 " values but the plan is for a model of ", model_num_elements_,
                                                 " (fingerprint ", FingerprintToHex(model_fingerprint_), ")"));
  }
  if (fragment_size != fragments_[index].num_elements) {
    return absl::InvalidArgumentError(fl::StrCat(op, " fragment ", index, ": the fragment buffer has ", fragment_size,
                                                 " values but the fragment has ", fragments_[index].num_elements));
  }
  return absl::OkStatus();
}

absl::Status FragmentPlan::Gather(size_t index, std::span<const float> model_values, std::span<float> out) const {
  if (absl::Status s = CheckSizes(index, model_values.size(), out.size(), "gather"); !s.ok()) return s;
  float* dst = out.data();
  for (const ElementRange& r : fragments_[index].ranges) {
    std::memcpy(dst, model_values.data() + r.offset, r.num_elements * sizeof(float));
    dst += r.num_elements;
  }
  return absl::OkStatus();
}

absl::Status FragmentPlan::Scatter(size_t index, std::span<const float> fragment_values,
                                   std::span<float> model_values) const {
  if (absl::Status s = CheckSizes(index, model_values.size(), fragment_values.size(), "scatter"); !s.ok()) {
    return s;
  }
  const float* src = fragment_values.data();
  for (const ElementRange& r : fragments_[index].ranges) {
    std::memcpy(model_values.data() + r.offset, src, r.num_elements * sizeof(float));
    src += r.num_elements;
  }
  return absl::OkStatus();
}

std::string FragmentPlan::Describe() const {
  std::string out =
      fl::StrCat(fragments_.size(), " fragment(s), ", FragmentStrategyName(strategy_), ", ", num_layers_, " layers\n");
  for (const Fragment& f : fragments_) {
    out += fl::StrCat("fragment ", f.index, ": ", f.layers.size(), " layers");
    if (!f.layers.empty()) out += fl::StrCat(" (", JoinFirst(f.layers, 6), ")");
    if (f.holds_non_layer) out += " + non-layer tensors";
    out += fl::StrCat(", ", f.tensor_indices.size(), " tensors, ", f.num_elements, " elements\n");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// FragmentSchedule

absl::StatusOr<FragmentSchedule> FragmentSchedule::Create(uint64_t inner_steps_per_round, size_t num_fragments,
                                                          uint64_t overlap_steps) {
  if (inner_steps_per_round < 1) {
    return absl::InvalidArgumentError(
        "inner_steps_per_round (H) = 0; it must be at least 1 (DiLoCo uses 500, Streaming DiLoCo 100)");
  }
  if (num_fragments < 1) {
    return absl::InvalidArgumentError("num_fragments (P) = 0; it must be at least 1");
  }
  if (inner_steps_per_round % num_fragments != 0) {
    const uint64_t p = num_fragments;
    const uint64_t lower = inner_steps_per_round / p * p;
    return absl::InvalidArgumentError(fl::StrCat(
        "inner_steps_per_round (H) = ", inner_steps_per_round, " is not divisible by num_fragments (P) = ",
        num_fragments, ": fragments go out every H/P steps, which must be whole; use ",
        lower == 0 ? fl::StrCat("H = ", p, " or a multiple of it")
                   : fl::StrCat("H = ", lower, " or ", lower + p, ", or a P that divides ", inner_steps_per_round)));
  }
  const uint64_t between = inner_steps_per_round / num_fragments;
  if (overlap_steps >= between) {
    return absl::InvalidArgumentError(
        fl::StrCat("overlap_steps (tau) = ", overlap_steps, " must be less than H/P = ", inner_steps_per_round, "/",
                   num_fragments, " = ", between,
                   " so that each exchange lands before the next one starts (the paper found tau < 5 robust); "
                   "use tau <= ",
                   between - 1));
  }
  FragmentSchedule s;
  s.inner_steps_per_round_ = inner_steps_per_round;
  s.num_fragments_ = num_fragments;
  s.overlap_steps_ = overlap_steps;
  s.steps_between_syncs_ = between;
  return s;
}

std::optional<size_t> FragmentSchedule::FragmentSyncingAt(uint64_t step) const {
  if (step == 0 || step % steps_between_syncs_ != 0) return std::nullopt;
  const uint64_t in_round = step % inner_steps_per_round_;
  if (in_round == 0) return num_fragments_ - 1;
  return static_cast<size_t>(in_round / steps_between_syncs_ - 1);
}

std::optional<size_t> FragmentSchedule::FragmentApplyingAt(uint64_t step) const {
  if (step < overlap_steps_) return std::nullopt;
  return FragmentSyncingAt(step - overlap_steps_);
}

uint64_t FragmentSchedule::SendStep(size_t fragment, uint64_t round) const {
  return round * inner_steps_per_round_ + (fragment + 1) * steps_between_syncs_;
}

uint64_t FragmentSchedule::NextSendStep(size_t fragment, uint64_t after_step) const {
  const uint64_t first = SendStep(fragment, 0);
  if (after_step < first) return first;
  return first + ((after_step - first) / inner_steps_per_round_ + 1) * inner_steps_per_round_;
}

}  // namespace fl::core

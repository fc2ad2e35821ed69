#include "fl/core/fragment_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

// status.message() is an absl::string_view, which Debian's Abseil keeps distinct from std::string_view.
::testing::AssertionResult HasSubstr(absl::string_view haystack, std::string_view needle) {
  if (fl::ToStd(haystack).find(needle) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in: " << haystack;
}

// A small transformer: embedding, `num_layers` blocks of 3 tensors, final norm and head.
ModelSpec Transformer(int num_layers, bool with_non_layer = true) {
  std::vector<TensorSpec> t;
  if (with_non_layer) t.push_back({"embed.weight", {16, 4}, DType::kFloat32, 0});
  for (int i = 0; i < num_layers; ++i) {
    t.push_back({fl::StrCat("blocks.", i, ".attn.weight"), {4, 4}, DType::kFloat32, 0});
    t.push_back({fl::StrCat("blocks.", i, ".mlp.weight"), {4, 8 + i}, DType::kFloat32, 0});
    t.push_back({fl::StrCat("blocks.", i, ".norm.bias"), {4}, DType::kFloat32, 0});
  }
  if (with_non_layer) {
    t.push_back({"norm.weight", {4}, DType::kFloat32, 0});
    t.push_back({"head.weight", {4, 16}, DType::kFloat32, 0});
  }
  return *ModelSpec::Create(std::move(t));
}

// Every tensor in exactly one fragment, every element in exactly one range, counts consistent.
void ExpectCoversModelOnce(const ModelSpec& model, const FragmentPlan& plan) {
  std::vector<int> tensor_hits(model.num_tensors(), 0);
  std::vector<int> element_hits(model.num_elements(), 0);
  for (const Fragment& f : plan.fragments()) {
    uint64_t range_total = 0;
    EXPECT_TRUE(std::is_sorted(f.tensor_indices.begin(), f.tensor_indices.end()));
    uint64_t tensor_total = 0;
    for (size_t i : f.tensor_indices) {
      ++tensor_hits[i];
      EXPECT_EQ(plan.FragmentOfTensor(i), f.index);
      tensor_total += model.tensors()[i].num_elements();
    }
    for (const ElementRange& r : f.ranges) {
      EXPECT_GT(r.num_elements, 0u);
      for (uint64_t e = r.offset; e < r.offset + r.num_elements; ++e) ++element_hits[e];
      range_total += r.num_elements;
    }
    EXPECT_EQ(range_total, f.num_elements);
    EXPECT_EQ(tensor_total, f.num_elements);
    ASSERT_NE(f.spec, nullptr);
    EXPECT_EQ(f.spec->num_elements(), f.num_elements);
    EXPECT_EQ(f.spec->num_tensors(), f.tensor_indices.size());
  }
  for (size_t i = 0; i < tensor_hits.size(); ++i) EXPECT_EQ(tensor_hits[i], 1) << model.tensors()[i].name;
  for (size_t e = 0; e < element_hits.size(); ++e) ASSERT_EQ(element_hits[e], 1) << "element " << e;
}

TEST(LayerIndexTest, FirstNumericComponent) {
  EXPECT_EQ(LayerIndexOf("blocks.3.attn.w"), 3u);
  EXPECT_EQ(LayerIndexOf("layers.10.mlp"), 10u);
  EXPECT_EQ(LayerIndexOf("model.layers.7.self_attn.q_proj.weight"), 7u);
  EXPECT_EQ(LayerIndexOf("layer1.0.conv1.weight"), 0u);  // "layer1" is not purely numeric
  EXPECT_EQ(LayerIndexOf("0.weight"), 0u);
  EXPECT_EQ(LayerIndexOf("a.2.b.5"), 2u);  // the first one
  EXPECT_EQ(LayerIndexOf("embed.weight"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("h1.w2"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("a..b"), std::nullopt);
  EXPECT_EQ(LayerIndexOf("x.99999999999999999999999.w"), std::nullopt);  // does not fit in 64 bits
  EXPECT_EQ(LayerKeyOf("blocks.3.attn.w"), "blocks.3");
  EXPECT_EQ(LayerKeyOf("layer2.1.bn.bias"), "layer2.1");
  EXPECT_EQ(LayerKeyOf("head.weight"), "");
  EXPECT_EQ(LayerKeyOf("blocks.12"), "blocks.12");
}

TEST(FragmentPlanTest, StridedWithNonLayer) {
  const ModelSpec model = Transformer(6);
  auto plan = FragmentPlan::Create(model, 4, FragmentStrategy::kStrided);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->num_fragments(), 4u);
  EXPECT_EQ(plan->num_layers(), 6u);
  // 3 layer fragments: i mod 3; the non-layer fragment last.
  EXPECT_EQ(plan->fragment(0).layers, (std::vector<std::string>{"blocks.0", "blocks.3"}));
  EXPECT_EQ(plan->fragment(1).layers, (std::vector<std::string>{"blocks.1", "blocks.4"}));
  EXPECT_EQ(plan->fragment(2).layers, (std::vector<std::string>{"blocks.2", "blocks.5"}));
  EXPECT_TRUE(plan->fragment(3).layers.empty());
  EXPECT_TRUE(plan->fragment(3).holds_non_layer);
  EXPECT_FALSE(plan->fragment(0).holds_non_layer);
  EXPECT_EQ(plan->fragment(3).tensor_indices, (std::vector<size_t>{0, 19, 20}));
  // Fragment 0 = tensors 1..3 (block 0) and 10..12 (block 3): two ranges.
  EXPECT_EQ(plan->fragment(0).tensor_indices, (std::vector<size_t>{1, 2, 3, 10, 11, 12}));
  ASSERT_EQ(plan->fragment(0).ranges.size(), 2u);
  EXPECT_EQ(plan->fragment(0).ranges[0].offset, model.tensors()[1].offset);
  EXPECT_EQ(plan->fragment(0).ranges[0].num_elements, 16u + 32u + 4u);
  ExpectCoversModelOnce(model, *plan);
}

TEST(FragmentPlanTest, SequentialIsContiguousAndBalanced) {
  const ModelSpec model = Transformer(7);
  auto plan = FragmentPlan::Create(model, 4, FragmentStrategy::kSequential);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 7 layers over 3 fragments: [0, 2), [2, 4), [4, 7).
  EXPECT_EQ(plan->fragment(0).layers, (std::vector<std::string>{"blocks.0", "blocks.1"}));
  EXPECT_EQ(plan->fragment(1).layers, (std::vector<std::string>{"blocks.2", "blocks.3"}));
  EXPECT_EQ(plan->fragment(2).layers, (std::vector<std::string>{"blocks.4", "blocks.5", "blocks.6"}));
  // Contiguous layers of contiguous tensors: one range each.
  for (size_t f = 0; f < 3; ++f) EXPECT_EQ(plan->fragment(f).ranges.size(), 1u) << f;
  ExpectCoversModelOnce(model, *plan);
}

TEST(FragmentPlanTest, CoversEveryTensorOnceForManyShapes) {
  for (bool with_non_layer : {true, false}) {
    for (int layers : {1, 2, 5, 12}) {
      const ModelSpec model = Transformer(layers, with_non_layer);
      const size_t max_fragments = static_cast<size_t>(layers) + (with_non_layer ? 1 : 0);
      for (size_t p = 1; p <= max_fragments; ++p) {
        for (FragmentStrategy strategy : {FragmentStrategy::kStrided, FragmentStrategy::kSequential}) {
          SCOPED_TRACE(fl::StrCat("layers=", layers, " non_layer=", with_non_layer, " P=", p, " ",
                                  FragmentStrategyName(strategy)));
          auto plan = FragmentPlan::Create(model, p, strategy);
          ASSERT_TRUE(plan.ok()) << plan.status();
          ASSERT_EQ(plan->num_fragments(), p);
          ExpectCoversModelOnce(model, *plan);
          // Every fragment holds something; layer counts differ by at most one.
          size_t min_layers = SIZE_MAX, max_layers = 0;
          for (const Fragment& f : plan->fragments()) {
            EXPECT_FALSE(f.tensor_indices.empty()) << "fragment " << f.index;
            if (f.holds_non_layer && p > 1) {
              EXPECT_EQ(f.index, p - 1);
              EXPECT_TRUE(f.layers.empty());
              continue;
            }
            min_layers = std::min(min_layers, f.layers.size());
            max_layers = std::max(max_layers, f.layers.size());
          }
          EXPECT_LE(max_layers - min_layers, 1u);
        }
      }
      // One more fragment than there is anything to put in is an error.
      auto too_many = FragmentPlan::Create(model, max_fragments + 1, FragmentStrategy::kStrided);
      ASSERT_FALSE(too_many.ok());
      EXPECT_TRUE(HasSubstr(too_many.status().message(), fl::StrCat("use num_fragments <= ", max_fragments)));
    }
  }
}

TEST(FragmentPlanTest, SingleFragmentIsTheWholeModel) {
  const ModelSpec model = Transformer(3);
  auto plan = FragmentPlan::Create(model, 1, FragmentStrategy::kStrided);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Fragment& f = plan->fragment(0);
  EXPECT_TRUE(f.holds_non_layer);
  EXPECT_EQ(f.layers.size(), 3u);
  EXPECT_EQ(f.num_elements, model.num_elements());
  ASSERT_EQ(f.ranges.size(), 1u);
  EXPECT_EQ(f.spec->fingerprint(), model.fingerprint());  // same tensors in the same order
}

TEST(FragmentPlanTest, LayersKeyedByPrefixAndOrderedNumerically) {
  // ResNet-style stages: layer1.0 and layer2.0 are different layers. Spec sorted alphabetically:
  // blocks.10 comes before blocks.2 but is ordered after it.
  std::vector<TensorSpec> t = {
      {"conv1.weight", {4}, DType::kFloat32, 0}, {"layer1.0.w", {2}, DType::kFloat32, 0},
      {"layer1.1.w", {2}, DType::kFloat32, 0},   {"layer2.0.w", {2}, DType::kFloat32, 0},
      {"layer2.1.w", {2}, DType::kFloat32, 0},   {"fc.weight", {3}, DType::kFloat32, 0},
  };
  const ModelSpec resnet = *ModelSpec::Create(t);
  auto plan = FragmentPlan::Create(resnet, 3, FragmentStrategy::kStrided);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_layers(), 4u);
  EXPECT_EQ(plan->fragment(0).layers, (std::vector<std::string>{"layer1.0", "layer2.0"}));
  EXPECT_EQ(plan->fragment(1).layers, (std::vector<std::string>{"layer1.1", "layer2.1"}));
  EXPECT_EQ(plan->fragment(2).tensor_indices, (std::vector<size_t>{0, 5}));

  std::vector<TensorSpec> sorted;
  for (const char* name : {"blocks.0.w", "blocks.1.w", "blocks.10.w", "blocks.11.w", "blocks.2.w", "blocks.3.w",
                           "blocks.4.w", "blocks.5.w", "blocks.6.w", "blocks.7.w", "blocks.8.w", "blocks.9.w"}) {
    sorted.push_back({name, {1}, DType::kFloat32, 0});
  }
  const ModelSpec alpha = *ModelSpec::Create(sorted);
  auto seq = FragmentPlan::Create(alpha, 3, FragmentStrategy::kSequential);
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(seq->fragment(0).layers, (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
  EXPECT_EQ(seq->fragment(2).layers, (std::vector<std::string>{"blocks.8", "blocks.9", "blocks.10", "blocks.11"}));
  ExpectCoversModelOnce(alpha, *seq);
}

// The char-level transformer of experiments/diloco/ (d_model 64, 3 blocks, 97-symbol vocabulary, context 64),
// tensor for tensor as LibTorch names them.
ModelSpec CharLm() {
  std::vector<TensorSpec> t = {{"tok_emb", {97, 64}, DType::kFloat32, 0}, {"pos_emb", {64, 64}, DType::kFloat32, 0}};
  for (int i = 0; i < 3; ++i) {
    const std::string b = fl::StrCat("blocks.", i, ".");
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"ln1.weight", {64}},
                                                                   {"ln1.bias", {64}},
                                                                   {"attn.qkv.weight", {192, 64}},
                                                                   {"attn.qkv.bias", {192}},
                                                                   {"attn.proj.weight", {64, 64}},
                                                                   {"attn.proj.bias", {64}},
                                                                   {"ln2.weight", {64}},
                                                                   {"ln2.bias", {64}},
                                                                   {"mlp.fc.weight", {256, 64}},
                                                                   {"mlp.fc.bias", {256}},
                                                                   {"mlp.proj.weight", {64, 256}},
                                                                   {"mlp.proj.bias", {64}}}) {
      t.push_back({b + name, shape, DType::kFloat32, 0});
    }
  }
  t.push_back({"ln_f.weight", {64}, DType::kFloat32, 0});
  t.push_back({"ln_f.bias", {64}, DType::kFloat32, 0});
  t.push_back({"head.weight", {97, 64}, DType::kFloat32, 0});
  t.push_back({"head.bias", {97}, DType::kFloat32, 0});
  return *ModelSpec::Create(std::move(t));
}

uint64_t LargestFragment(const FragmentPlan& plan) {
  uint64_t largest = 0;
  for (const Fragment& f : plan.fragments()) largest = std::max(largest, f.num_elements);
  return largest;
}

TEST(FragmentPlanTest, BalancedCutsThePeakByAboutP) {
  const ModelSpec model = CharLm();
  auto strided = FragmentPlan::Create(model, 4, FragmentStrategy::kStrided);
  auto balanced = FragmentPlan::Create(model, 4, FragmentStrategy::kBalanced);
  ASSERT_TRUE(strided.ok()) << strided.status();
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  ExpectCoversModelOnce(model, *balanced);
  const double total = static_cast<double>(model.num_elements());
  // Strided: three one-block fragments and a small non-layer one, so the peak is one block (~1/3.3).
  EXPECT_LT(total / static_cast<double>(LargestFragment(*strided)), 3.5);
  // Balanced: the largest fragment is within one tensor (16,384 values) of the mean, and here within 5%.
  const uint64_t mean = model.num_elements() / 4;
  EXPECT_LE(LargestFragment(*balanced), mean + 16384);
  EXPECT_GT(total / static_cast<double>(LargestFragment(*balanced)), 3.8);
  // Non-layer tensors are spread with the rest, and fragments list the layers they touch.
  size_t fragments_with_non_layer = 0;
  for (const Fragment& f : balanced->fragments()) {
    EXPECT_FALSE(f.tensor_indices.empty());
    if (f.holds_non_layer) ++fragments_with_non_layer;
    for (size_t i : f.tensor_indices) {
      const std::string_view key = LayerKeyOf(model.tensors()[i].name);
      if (!key.empty()) {
        EXPECT_NE(std::find(f.layers.begin(), f.layers.end(), std::string(key)), f.layers.end())
            << model.tensors()[i].name << " in fragment " << f.index;
      }
    }
  }
  EXPECT_GE(fragments_with_non_layer, 2u);
  EXPECT_EQ(balanced->strategy(), FragmentStrategy::kBalanced);
}

TEST(FragmentPlanTest, BalancedIsDeterministicAndCoversEveryShape) {
  for (bool with_non_layer : {true, false}) {
    for (int layers : {1, 2, 5, 12}) {
      const ModelSpec model = Transformer(layers, with_non_layer);
      size_t non_empty = 0;
      for (const TensorSpec& t : model.tensors()) non_empty += t.num_elements() > 0 ? 1 : 0;
      for (size_t p = 1; p <= non_empty; ++p) {
        SCOPED_TRACE(fl::StrCat("layers=", layers, " non_layer=", with_non_layer, " P=", p));
        auto a = FragmentPlan::Create(model, p, FragmentStrategy::kBalanced);
        auto b = FragmentPlan::Create(model, p, FragmentStrategy::kBalanced);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        ExpectCoversModelOnce(model, *a);
        for (size_t f = 0; f < p; ++f) {
          EXPECT_EQ(a->fragment(f).tensor_indices, b->fragment(f).tensor_indices);
          EXPECT_FALSE(a->fragment(f).tensor_indices.empty()) << "fragment " << f;
        }
        // Largest-first greedy: no fragment exceeds the mean by more than the largest tensor.
        uint64_t largest_tensor = 0;
        for (const TensorSpec& t : model.tensors()) largest_tensor = std::max(largest_tensor, t.num_elements());
        EXPECT_LE(LargestFragment(*a), model.num_elements() / p + largest_tensor);
      }
      auto too_many = FragmentPlan::Create(model, non_empty + 1, FragmentStrategy::kBalanced);
      ASSERT_FALSE(too_many.ok());
      EXPECT_TRUE(HasSubstr(too_many.status().message(), fl::StrCat("use num_fragments <= ", non_empty)));
    }
  }
}

TEST(FragmentPlanTest, GatherScatterRoundTrip) {
  const ModelSpec model = Transformer(5);
  auto plan = FragmentPlan::Create(model, 3, FragmentStrategy::kStrided);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<float> values(model.num_elements());
  std::iota(values.begin(), values.end(), 0.0f);
  std::vector<float> rebuilt(model.num_elements(), -1.0f);
  for (const Fragment& f : plan->fragments()) {
    std::vector<float> part(f.num_elements);
    ASSERT_TRUE(plan->Gather(f.index, values, part).ok());
    // Laid out as the fragment's own spec: each of its tensors in order.
    uint64_t at = 0;
    for (size_t k = 0; k < f.tensor_indices.size(); ++k) {
      const TensorSpec& t = model.tensors()[f.tensor_indices[k]];
      EXPECT_EQ(part[at], static_cast<float>(t.offset)) << t.name;
      EXPECT_EQ(f.spec->tensors()[k].name, t.name);
      EXPECT_EQ(f.spec->tensors()[k].offset, at);
      at += t.num_elements();
    }
    ASSERT_TRUE(plan->Scatter(f.index, part, rebuilt).ok());
  }
  EXPECT_EQ(rebuilt, values);

  std::vector<float> wrong(plan->fragment(0).num_elements + 1);
  absl::Status s = plan->Gather(0, values, wrong);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(HasSubstr(s.message(), "the fragment buffer has"));
  std::vector<float> tiny_model(3);
  s = plan->Scatter(0, std::vector<float>(plan->fragment(0).num_elements), tiny_model);
  EXPECT_TRUE(HasSubstr(s.message(), "the model buffer has 3 values"));
  EXPECT_FALSE(plan->Gather(7, values, wrong).ok());
}

TEST(FragmentPlanTest, Errors) {
  const ModelSpec model = Transformer(2);
  auto zero = FragmentPlan::Create(model, 0, FragmentStrategy::kStrided);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(HasSubstr(zero.status().message(), "num_fragments = 0"));

  auto no_layers_model =
      *ModelSpec::Create({{"embed.weight", {4}, DType::kFloat32, 0}, {"head", {2}, DType::kFloat32, 0}});
  auto no_layers = FragmentPlan::Create(no_layers_model, 2, FragmentStrategy::kStrided);
  ASSERT_FALSE(no_layers.ok());
  EXPECT_TRUE(HasSubstr(no_layers.status().message(), "no tensor name has a layer index"));
  EXPECT_TRUE(FragmentPlan::Create(no_layers_model, 1, FragmentStrategy::kStrided).ok());

  // 2 layers + non-layer: at most 3 fragments.
  auto too_many = FragmentPlan::Create(model, 4, FragmentStrategy::kSequential);
  ASSERT_FALSE(too_many.ok());
  EXPECT_TRUE(HasSubstr(too_many.status().message(), "it has 2 layers (blocks.0, blocks.1)"));
  EXPECT_TRUE(HasSubstr(too_many.status().message(), "non-layer tensors (embed.weight, norm.weight, head.weight)"));

  EXPECT_EQ(ParseFragmentStrategy("strided").value(), FragmentStrategy::kStrided);
  EXPECT_EQ(ParseFragmentStrategy("sequential").value(), FragmentStrategy::kSequential);
  EXPECT_EQ(ParseFragmentStrategy("balanced").value(), FragmentStrategy::kBalanced);
  EXPECT_EQ(FragmentStrategyName(FragmentStrategy::kBalanced), "balanced");
  EXPECT_FALSE(ParseFragmentStrategy("random").ok());
}

// ---------------------------------------------------------------------------------------------------------
// Schedule

TEST(FragmentScheduleTest, OneFragmentEveryHOverPStepsEachOncePerWindow) {
  for (uint64_t h : {1u, 4u, 12u, 100u}) {
    for (size_t p : {1u, 2u, 3u, 4u, 5u}) {
      if (h % p != 0) continue;
      for (uint64_t tau = 0; tau < h / p; ++tau) {
        SCOPED_TRACE(fl::StrCat("H=", h, " P=", p, " tau=", tau));
        auto schedule = FragmentSchedule::Create(h, p, tau);
        ASSERT_TRUE(schedule.ok()) << schedule.status();
        const uint64_t every = h / p;
        EXPECT_EQ(schedule->steps_between_syncs(), every);
        EXPECT_FALSE(schedule->FragmentSyncingAt(0).has_value());
        std::vector<uint64_t> last_send(p, 0);
        for (uint64_t t = 1; t <= 5 * h; ++t) {
          const std::optional<size_t> f = schedule->FragmentSyncingAt(t);
          EXPECT_EQ(f.has_value(), t % every == 0) << "step " << t;
          if (f.has_value()) {
            ASSERT_LT(*f, p);
            // The formula itself: t mod H == ((f + 1) H / P) mod H.
            EXPECT_EQ(t % h, ((*f + 1) * h / p) % h);
            // Once per H steps: consecutive sends of a fragment are exactly H apart; the first is within H.
            if (last_send[*f] != 0)
              EXPECT_EQ(t - last_send[*f], h);
            else
              EXPECT_LE(t, h);
            last_send[*f] = t;
            EXPECT_EQ(schedule->ApplyStep(t), t + tau);
            EXPECT_EQ(schedule->FragmentApplyingAt(t + tau), f);
            EXPECT_EQ(schedule->SendStep(*f, (t - 1) / h), t);
            EXPECT_EQ(schedule->NextSendStep(*f, t - 1), t);
            EXPECT_EQ(schedule->NextSendStep(*f, t), t + h);
          }
          const bool applying = t >= tau && (t - tau) >= 1 && (t - tau) % every == 0;
          EXPECT_EQ(schedule->FragmentApplyingAt(t).has_value(), applying) << "step " << t;
        }
        // Every window of H consecutive steps holds each fragment exactly once.
        for (uint64_t start = 1; start + h - 1 <= 5 * h; ++start) {
          std::vector<int> count(p, 0);
          for (uint64_t t = start; t < start + h; ++t) {
            if (auto f = schedule->FragmentSyncingAt(t)) ++count[*f];
          }
          for (size_t f = 0; f < p; ++f) ASSERT_EQ(count[f], 1) << "fragment " << f << " window from " << start;
        }
      }
    }
  }
}

TEST(FragmentScheduleTest, ConcreteSchedule) {
  // H = 100, P = 4, tau = 5: fragment 0 at 25, 125, ...; 1 at 50; 2 at 75; 3 at 100, 200.
  auto s = FragmentSchedule::Create(100, 4, 5);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->FragmentSyncingAt(25), 0u);
  EXPECT_EQ(s->FragmentSyncingAt(50), 1u);
  EXPECT_EQ(s->FragmentSyncingAt(75), 2u);
  EXPECT_EQ(s->FragmentSyncingAt(100), 3u);
  EXPECT_EQ(s->FragmentSyncingAt(125), 0u);
  EXPECT_EQ(s->FragmentSyncingAt(26), std::nullopt);
  EXPECT_EQ(s->ApplyStep(25), 30u);
  EXPECT_EQ(s->FragmentApplyingAt(30), 0u);
  EXPECT_EQ(s->FragmentApplyingAt(105), 3u);
  EXPECT_EQ(s->FragmentApplyingAt(5), std::nullopt);  // step 0 sends nothing
  EXPECT_EQ(s->SendStep(3, 1), 200u);
  EXPECT_EQ(s->NextSendStep(0, 0), 25u);
  EXPECT_EQ(s->NextSendStep(0, 25), 125u);
  EXPECT_EQ(s->NextSendStep(2, 130), 175u);
}

TEST(FragmentScheduleTest, Errors) {
  auto expect_error = [](uint64_t h, size_t p, uint64_t tau, const char* needle) {
    auto s = FragmentSchedule::Create(h, p, tau);
    ASSERT_FALSE(s.ok()) << h << " " << p << " " << tau;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasSubstr(s.status().message(), needle));
  };
  expect_error(0, 1, 0, "inner_steps_per_round (H) = 0");
  expect_error(10, 0, 0, "num_fragments (P) = 0");
  expect_error(100, 3, 0, "(H) = 100 is not divisible by num_fragments (P) = 3");
  expect_error(100, 3, 0, "use H = 99 or 102");
  expect_error(2, 3, 0, "use H = 3 or a multiple of it");
  expect_error(100, 4, 25, "overlap_steps (tau) = 25 must be less than H/P = 100/4 = 25");
  EXPECT_TRUE(FragmentSchedule::Create(100, 4, 24).ok());
  EXPECT_TRUE(FragmentSchedule::Create(1, 1, 0).ok());
}

}  // namespace
}  // namespace fl::core

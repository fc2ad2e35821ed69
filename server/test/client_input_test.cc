// Unit tests of the bounds on what clients send (client_input.h); the end-to-end cases through gRPC are in
// client_reports_test.cc.
#include "fl/server/client_input.h"

#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

namespace fl::server {
namespace {

TEST(LogSafeTest, EscapesControlAndNonAsciiBytesAndCutsLongText) {
  EXPECT_EQ(LogSafe("pi-07"), "pi-07");
  EXPECT_EQ(LogSafe("a\nb\rc\td\\e"), "a\\nb\\rc\\td\\\\e");
  EXPECT_EQ(LogSafe(std::string("\x1b[31mred\x00", 9)), "\\x1b[31mred\\x00");
  EXPECT_EQ(LogSafe("caf\xc3\xa9"), "caf\\xc3\\xa9");
  EXPECT_EQ(LogSafe(std::string(1000, 'x'), 4), "xxxx...(1000 bytes)");
}

TEST(CheckJoinRequestSizesTest, NamesTheFirstFieldOverItsLimit) {
  fl::v1::JoinRequest r;
  r.mutable_device()->set_device_class("gpu");
  (*r.mutable_labels())["site"] = "lab-a";
  EXPECT_FALSE(CheckJoinRequestSizes(r).has_value());
  r.mutable_device()->set_hostname(std::string(InputLimits::kLongText + 1, 'h'));
  auto p = CheckJoinRequestSizes(r);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->field, "device.hostname");
  EXPECT_NE(p->message.find("257 bytes long; the limit is 256"), std::string::npos) << p->message;
  r.mutable_device()->clear_hostname();
  r.mutable_device()->set_memory_bytes(~uint64_t{0});  // stored as -1, the records' CHECK would drop the row
  p = CheckJoinRequestSizes(r);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->field, "device.memory_bytes");
  r.mutable_device()->set_memory_bytes(uint64_t{8} << 30);
  r.mutable_device()->set_device_class("gpu\xff");
  p = CheckJoinRequestSizes(r);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->field, "device.device_class");
  EXPECT_NE(p->message.find("'gpu\\xff' holds a byte that is not printable ASCII"), std::string::npos) << p->message;
  r.mutable_device()->set_device_class("gpu");
  fl::v1::TensorSpec* t = r.mutable_model_spec()->add_tensors();
  t->set_name("deep");
  for (int i = 0; i < 17; ++i) t->add_shape(1);
  p = CheckJoinRequestSizes(r);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->field, "model_spec.tensors[0].shape");
  EXPECT_NE(p->message.find("17 dimensions; the limit is 16"), std::string::npos) << p->message;
}

UpdateBounds Bounds() {
  UpdateBounds b;
  b.max_examples = 600;
  b.examples_basis = "declared";
  b.max_steps = 75;
  b.max_phase_ns = 10'000'000'000;
  b.max_phase_bytes = 1 << 20;
  return b;
}

fl::v1::UpdateHeader Good() {
  fl::v1::UpdateHeader h;
  h.set_num_examples(600);
  (*h.mutable_metrics())["train_loss"] = 0.3;
  (*h.mutable_metrics())["train_accuracy"] = 0.9;
  (*h.mutable_metrics())["num_steps"] = 75;
  fl::v1::PhaseTiming* t = h.add_timings();
  t->set_phase(fl::v1::PHASE_TRAIN);
  t->set_start_client_ns(123);
  t->set_duration_ns(9'000'000'000);
  return h;
}

TEST(CheckUpdateReportTest, AcceptsAnHonestReportAndRefusesEachBound) {
  EXPECT_FALSE(CheckUpdateReport(Good(), Bounds()).has_value());
  auto refused = [](auto mutate) {
    fl::v1::UpdateHeader h = Good();
    mutate(h);
    auto p = CheckUpdateReport(h, Bounds());
    return p.has_value() ? p->field : std::string("(accepted)");
  };
  EXPECT_EQ(refused([](auto& h) { h.set_num_examples(601); }), "num_examples");
  EXPECT_EQ(refused([](auto& h) { h.set_num_examples(0); }), "num_examples");
  EXPECT_EQ(refused([](auto& h) { (*h.mutable_metrics())["train_loss"] = std::nan(""); }), "metrics[train_loss]");
  EXPECT_EQ(refused([](auto& h) { (*h.mutable_metrics())["train_accuracy"] = -0.1; }), "metrics[train_accuracy]");
  EXPECT_EQ(refused([](auto& h) { (*h.mutable_metrics())["num_steps"] = 76; }), "metrics[num_steps]");
  EXPECT_EQ(refused([](auto& h) { (*h.mutable_metrics())["num_steps"] = 7.5; }), "metrics[num_steps]");
  // Two train phases of 6 s each add up to more than the 10 s bound.
  EXPECT_EQ(refused([](auto& h) {
              h.mutable_timings(0)->set_duration_ns(6'000'000'000);
              *h.add_timings() = h.timings(0);
            }),
            "timings");
  EXPECT_EQ(refused([](auto& h) { h.mutable_timings(0)->set_start_client_ns(std::numeric_limits<int64_t>::min()); }),
            "timings (PHASE_TRAIN)");
  EXPECT_EQ(refused([](auto& h) { h.set_task_id(std::string(300, 't')); }), "task_id");
}

TEST(CheckEvaluationReportTest, BoundsTheExampleCountAndTheTimings) {
  fl::v1::EvaluationResult r;
  r.set_num_examples(100);
  EXPECT_FALSE(CheckEvaluationReport(r, 100, 1'000'000).has_value());
  r.set_num_examples(101);
  EXPECT_EQ(CheckEvaluationReport(r, 100, 1'000'000)->field, "num_examples");
  r.set_num_examples(100);
  fl::v1::PhaseTiming* t = r.add_timings();
  t->set_phase(fl::v1::PHASE_EVAL);
  t->set_duration_ns(2'000'000);
  EXPECT_EQ(CheckEvaluationReport(r, 100, 1'000'000)->field, "timings (PHASE_EVAL)");
}

}  // namespace
}  // namespace fl::server

// SyntheticTrainer: a stand-in for training, for measuring the transport alone.
//
// "Training" returns the received model plus a small seeded perturbation, at memory speed, so that a
// benchmark of K clients x P parameters measures downloads, uploads and aggregation and nothing else. It is
// selected explicitly (`fl-client --model synthetic:<params>`) and never passes for a real trainer: its
// model name says "synthetic" in every record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fl/training/trainer.h"

namespace fl::client {

class SyntheticTrainer final : public training::Trainer {
 public:
  // `num_params` parameters split into tensors "layers.<i>.weight" of at most 1M values each; initial
  // values are a deterministic function of `seed`. `train_ms` > 0 makes every Train take that long (a
  // stand-in for compute time in tests of timing and failure behaviour). `task` is what task() reports
  // ("classification", "regression", "next-token"), so that tests can run a real session of each task; see
  // Evaluate for the figures it reports.
  SyntheticTrainer(uint64_t num_params, uint64_t num_examples, uint64_t seed, uint32_t train_ms = 0,
                   std::string task = "classification");

  const core::ModelSpec& spec() const override { return spec_; }
  std::string model_name() const override;
  std::string task() const override { return task_; }
  uint64_t num_train_examples() const override { return num_examples_; }
  uint64_t num_test_examples() const override { return num_examples_; }
  absl::Status GetParameters(std::span<float> out) override;
  absl::StatusOr<training::TrainResult> Train(std::span<const float> global,
                                              const training::TrainOptions& options) override;
  // Figures that are a deterministic function of `global`, in the ranges the server accepts: loss = mean of
  // the squared values; accuracy 0 (classification), exp(-loss) (next-token's token accuracy) or 0
  // (regression); mae = mean absolute value (regression only).
  absl::StatusOr<training::EvalResult> Evaluate(std::span<const float> global) override;

 private:
  core::ModelSpec spec_;
  std::vector<float> params_;
  uint64_t num_examples_;
  uint32_t train_ms_;
  std::string task_;
};

}  // namespace fl::client

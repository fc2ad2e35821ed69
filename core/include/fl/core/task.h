// The learning task a model is trained for, and what its evaluation reports.
//
// One experiment has one task: the first client admitted fixes it (as it fixes the model), and its figures
// go into the records, Prometheus and fl-report under the task's own metric:
//   classification  loss = cross-entropy;            metric accuracy (fraction of examples, 0..1)
//   regression      loss = mean squared error;       metric MAE (mean absolute error, >= 0)
//   next-token      loss = mean per-token cross-entropy (nats); metric perplexity = exp(loss), and the
//                   token accuracy (fraction of tokens predicted right, 0..1)
// The spelling here is the one on the wire (JoinRequest.task), in the records (experiments.task) and on
// fl-client's command line.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace fl::core {

enum class Task { kClassification, kRegression, kNextToken };

// "classification", "regression", "next-token".
std::string_view TaskName(Task task);

// The inverse of TaskName. An empty name is "classification": clients and databases from before tasks
// existed trained classifiers only. Anything else is InvalidArgument naming the value and the valid names.
absl::StatusOr<Task> ParseTask(std::string_view name);

// The figure a person looks at for the task: "accuracy", "mae" or "perplexity".
std::string_view TaskMetricName(Task task);

}  // namespace fl::core

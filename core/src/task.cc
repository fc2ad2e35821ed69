#include "fl/core/task.h"

#include "fl/core/str_cat.h"

namespace fl::core {

std::string_view TaskName(Task task) {
  switch (task) {
    case Task::kClassification: return "classification";
    case Task::kRegression: return "regression";
    case Task::kNextToken: return "next-token";
  }
  return "unknown";
}

absl::StatusOr<Task> ParseTask(std::string_view name) {
  if (name.empty()) return Task::kClassification;
  for (Task t : {Task::kClassification, Task::kRegression, Task::kNextToken}) {
    if (TaskName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      fl::StrCat("unknown task '", name, "'; the tasks are classification, regression and next-token"));
}

std::string_view TaskMetricName(Task task) {
  switch (task) {
    case Task::kClassification: return "accuracy";
    case Task::kRegression: return "mae";
    case Task::kNextToken: return "perplexity";
  }
  return "unknown";
}

}  // namespace fl::core

// Server (outer) optimizers: how the server turns a round's aggregate into the next global model.
//
// Convention. Every optimizer takes the PSEUDO-GRADIENT
//
//     g = theta_global - aggregate(theta_client)          (= aggregate(theta_global - theta_client))
//
// i.e. DiLoCo's outer gradient (arXiv 2311.08105), which points uphill like a gradient, so that plain
// gradient-descent formulas apply: theta <- theta - lr * g. With lr = 1 FedAvg therefore gives back the
// aggregate (up to the rounding of the subtraction, which is exact whenever the two are within a factor 2
// of each other). FedOpt (Reddi et al. 2020, "Adaptive Federated Optimization", arXiv 2003.00295) writes
// its update as Delta = aggregate - theta = -g; the adaptive optimizers below use Delta internally so that
// their formulas read exactly as in the paper. Clients may send either models (the server forms g with
// PseudoGradient) or deltas theta_global - theta_client (whose aggregate is g itself: the weighted mean is
// linear; the median and trimmed mean are too under the same shift, being coordinate-wise).
//
// Implementations and their defaults (names as accepted by MakeServerOptimizer):
//   fedavg      theta -= lr * g                                       lr 1.0 (McMahan et al. 2017)
//   fedavgm     v = momentum * v + g; theta -= lr * v                 lr 1.0, momentum 0.9 (Hsu et al. 2019)
//   fedadam     m = b1 m + (1-b1) Delta; v = b2 v + (1-b2) Delta^2;   lr 0.1, b1 0.9, b2 0.99, tau 1e-9
//               theta += lr * m / (sqrt(v) + tau)
//   fedyogi     as fedadam but v = v - (1-b2) Delta^2 sign(v - Delta^2)  lr 0.01, b1 0.9, b2 0.99, tau 1e-3
//   fedadagrad  as fedadam but v = v + Delta^2                        lr 0.1, b1 0.0, tau 1e-9
//   nesterov    buf = mu * buf + g; theta -= lr * (g + mu * buf)      lr 0.7, mu 0.9 (DiLoCo's outer step)
// The FedOpt defaults are Flower's (FedAdam / FedYogi / FedAdagrad strategies). No bias correction, as in
// the paper's Algorithm 2 and Flower. State starts at zero (m, v, momentum buffers), as in Flower and
// PyTorch; the paper only asks v_{-1} >= tau^2, which `initial_v` can set (tau^2 = 1e-18 by default, so
// the two agree to far below fp32 resolution unless Delta is tiny).
//
// All arithmetic is in fp32, like the state, as in PyTorch's optimizers. A Step either fails before
// touching anything (sizes, NaN/Inf in g) or updates theta and the state completely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::core {

// out = global - aggregate: the pseudo-gradient every optimizer takes. Sizes must match.
absl::Status PseudoGradient(std::span<const float> global, std::span<const float> aggregate, std::span<float> out);

struct NamedBuffer {
  std::string name;
  std::vector<float> values;
};

// What a checkpoint stores of an optimizer. Hyperparameters are not part of it: they come from the run's
// configuration, which may legitimately change between restarts (a new learning rate).
struct ServerOptimizerState {
  std::string optimizer;  // name() of the exporter; ImportState refuses another optimizer's state
  uint64_t step_count = 0;
  std::vector<NamedBuffer> buffers;  // e.g. "momentum"; "m", "v"; each num_params values
};

class ServerOptimizer {
 public:
  virtual ~ServerOptimizer() = default;
  ServerOptimizer(const ServerOptimizer&) = delete;
  ServerOptimizer& operator=(const ServerOptimizer&) = delete;

  // "fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "nesterov".
  virtual std::string_view name() const = 0;
  // The hyperparameters in effect, for logs: "lr=0.1 beta1=0.9 beta2=0.99 tau=1e-09 initial_v=0".
  virtual std::string DescribeConfig() const = 0;

  size_t num_params() const { return num_params_; }
  // Steps applied so far (restored by ImportState).
  uint64_t step_count() const { return step_count_; }

  // Applies one outer step to `global` in place, given the pseudo-gradient (see the file comment).
  // InvalidArgument when a size differs from num_params() or g holds NaN/Inf; then nothing changes.
  absl::Status Step(std::span<float> global, std::span<const float> pseudo_grad);

  ServerOptimizerState ExportState() const;
  // Replaces the state. Checks the optimizer name, the buffer names (each expected one exactly once, in
  // any order), their sizes and values (finite; second moments >= 0). On error nothing changes.
  absl::Status ImportState(const ServerOptimizerState& state);

  // Back to the initial state (step 0).
  void Reset();

 protected:
  struct BufferSpec {
    std::string name;
    float initial_value = 0.0f;  // every element starts (and restarts on Reset) at this value
  };
  ServerOptimizer(size_t num_params, std::vector<BufferSpec> buffers);

  // Called once sizes and finiteness are checked.
  virtual void StepValidated(std::span<float> global, std::span<const float> g) = 0;
  // Extra checks on an imported buffer (e.g. v >= 0); the default accepts any finite values.
  virtual absl::Status ValidateBuffer(size_t /*index*/, std::span<const float> /*values*/) const {
    return absl::OkStatus();
  }

  // Buffer `index` in the order given to the constructor.
  std::span<float> buffer(size_t index) { return buffers_[index].values; }

 private:
  size_t num_params_;
  uint64_t step_count_ = 0;
  std::vector<BufferSpec> buffer_specs_;
  std::vector<NamedBuffer> buffers_;
};

// ---------------------------------------------------------------------------------------------------------
// Hyperparameters. Each Validate() returns InvalidArgument naming the field, its value and the valid range.

struct FedAvgConfig {
  double lr = 1.0;  // 1.0: the new model is the aggregate (McMahan et al. 2017; Flower's FedAvg)
  absl::Status Validate() const;
};

struct FedAvgMConfig {
  // Hsu, Qi, Brown 2019, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
  // Classification" (arXiv 1909.06335): server momentum 0.9 with server lr 1.0. (Flower's FedAvgM
  // defaults to momentum 0.0, which is plain FedAvg.)
  double lr = 1.0;
  double momentum = 0.9;
  absl::Status Validate() const;
};

enum class FedOptVariant { kAdam, kYogi, kAdagrad };

struct FedOptConfig {
  FedOptVariant variant = FedOptVariant::kAdam;
  double lr = 0.1;      // eta
  double beta1 = 0.9;   // first-moment decay
  double beta2 = 0.99;  // second-moment decay (unused by Adagrad)
  double tau = 1e-9;    // adaptivity / epsilon, added to sqrt(v)
  double initial_v = 0.0;

  // Flower's defaults for each (Reddi et al. 2020 tune lr per task; these are Flower's strategy defaults).
  static FedOptConfig Adam();     // lr 0.1,  beta1 0.9, beta2 0.99, tau 1e-9
  static FedOptConfig Yogi();     // lr 0.01, beta1 0.9, beta2 0.99, tau 1e-3
  static FedOptConfig Adagrad();  // lr 0.1,  beta1 0.0,             tau 1e-9
  absl::Status Validate() const;
};

struct NesterovConfig {
  // DiLoCo (arXiv 2311.08105) and Streaming DiLoCo: outer SGD with Nesterov momentum, lr 0.7, momentum
  // 0.9; the update is PyTorch's SGD(nesterov=True, dampening=0).
  double lr = 0.7;
  double momentum = 0.9;
  absl::Status Validate() const;
};

// The constructors take validated configs (use the Make* functions, or Validate() first).
class FedAvgOptimizer final : public ServerOptimizer {
 public:
  FedAvgOptimizer(size_t num_params, const FedAvgConfig& config);
  std::string_view name() const override { return "fedavg"; }
  std::string DescribeConfig() const override;
  const FedAvgConfig& config() const { return config_; }

 private:
  void StepValidated(std::span<float> global, std::span<const float> g) override;
  FedAvgConfig config_;
};

class FedAvgMOptimizer final : public ServerOptimizer {
 public:
  FedAvgMOptimizer(size_t num_params, const FedAvgMConfig& config);  // buffer "momentum"
  std::string_view name() const override { return "fedavgm"; }
  std::string DescribeConfig() const override;
  const FedAvgMConfig& config() const { return config_; }

 private:
  void StepValidated(std::span<float> global, std::span<const float> g) override;
  FedAvgMConfig config_;
};

class FedOptOptimizer final : public ServerOptimizer {
 public:
  FedOptOptimizer(size_t num_params, const FedOptConfig& config);  // buffers "m", "v"
  std::string_view name() const override;
  std::string DescribeConfig() const override;
  const FedOptConfig& config() const { return config_; }

 private:
  void StepValidated(std::span<float> global, std::span<const float> g) override;
  absl::Status ValidateBuffer(size_t index, std::span<const float> values) const override;
  FedOptConfig config_;
};

class NesterovOptimizer final : public ServerOptimizer {
 public:
  NesterovOptimizer(size_t num_params, const NesterovConfig& config);  // buffer "momentum"
  std::string_view name() const override { return "nesterov"; }
  std::string DescribeConfig() const override;
  const NesterovConfig& config() const { return config_; }

 private:
  void StepValidated(std::span<float> global, std::span<const float> g) override;
  NesterovConfig config_;
};

// Hyperparameters by name, as written in a config file: "lr", "momentum" (fedavgm, nesterov), "beta1",
// "beta2", "tau", "initial_v" (FedOpt; no beta2 for fedadagrad). Unset keys keep the defaults above.
using ServerOptimizerOptions = std::map<std::string, double, std::less<>>;

// name: "fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "nesterov" (alias "diloco").
// InvalidArgument for an unknown name, an option the optimizer does not take, or a value out of range.
absl::StatusOr<std::unique_ptr<ServerOptimizer>> MakeServerOptimizer(std::string_view name,
                                                                     const ServerOptimizerOptions& options,
                                                                     size_t num_params);
// The same from one string: "fedadam", "fedadam:lr=0.03,tau=1e-3", "nesterov:lr=0.5".
absl::StatusOr<std::unique_ptr<ServerOptimizer>> MakeServerOptimizer(std::string_view spec, size_t num_params);

}  // namespace fl::core

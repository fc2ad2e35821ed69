#include "fl/core/server_optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"

namespace fl::core {
namespace {

// `lo <= value < hi` (or <= hi when hi_inclusive), written so that NaN fails.
absl::Status CheckRange(std::string_view optimizer, std::string_view field, double value, double lo, bool lo_inclusive,
                        double hi, bool hi_inclusive, std::string_view advice) {
  const bool above_lo = lo_inclusive ? value >= lo : value > lo;
  const bool below_hi = hi_inclusive ? value <= hi : value < hi;
  if (above_lo && below_hi && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(fl::StrCat(optimizer, " ", field, " = ", value, " is out of range; it must be in ",
                                               lo_inclusive ? "[" : "(", lo, ", ", hi, hi_inclusive ? "]" : ")",
                                               advice.empty() ? "" : " (", advice, advice.empty() ? "" : ")"));
}

constexpr double kInf = HUGE_VAL;

absl::Status CheckLr(std::string_view optimizer, double lr, std::string_view advice) {
  return CheckRange(optimizer, "lr", lr, 0.0, false, kInf, false, advice);
}
absl::Status CheckMomentum(std::string_view optimizer, double momentum) {
  return CheckRange(optimizer, "momentum", momentum, 0.0, true, 1.0, false,
                    "1 or more makes the momentum buffer grow without bound; 0 turns momentum off");
}

std::string_view VariantName(FedOptVariant variant) {
  switch (variant) {
    case FedOptVariant::kAdam: return "fedadam";
    case FedOptVariant::kYogi: return "fedyogi";
    case FedOptVariant::kAdagrad: return "fedadagrad";
  }
  return "fedopt";
}

}  // namespace

absl::Status PseudoGradient(std::span<const float> global, std::span<const float> aggregate, std::span<float> out) {
  if (global.size() != aggregate.size() || out.size() != global.size()) {
    return absl::InvalidArgumentError(fl::StrCat("pseudo-gradient needs equal sizes: global model has ", global.size(),
                                                 " values, aggregate ", aggregate.size(), ", output ", out.size()));
  }
  for (size_t i = 0; i < out.size(); ++i) out[i] = global[i] - aggregate[i];
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------------------
// ServerOptimizer

ServerOptimizer::ServerOptimizer(size_t num_params, std::vector<BufferSpec> buffers)
    : num_params_(num_params), buffer_specs_(std::move(buffers)) {
  buffers_.reserve(buffer_specs_.size());
  for (const BufferSpec& spec : buffer_specs_) {
    buffers_.push_back(NamedBuffer{spec.name, std::vector<float>(num_params_, spec.initial_value)});
  }
}

absl::Status ServerOptimizer::Step(std::span<float> global, std::span<const float> pseudo_grad) {
  if (global.size() != num_params_ || pseudo_grad.size() != num_params_) {
    return absl::InvalidArgumentError(fl::StrCat(name(), " step: the optimizer was made for ", num_params_,
                                                 " parameters but got a global model of ", global.size(),
                                                 " and a pseudo-gradient of ", pseudo_grad.size(),
                                                 "; make the optimizer with the model's element count"));
  }
  // A NaN here would poison the optimizer state for every later round; the aggregators never produce
  // one, so this only guards against a caller's bug.
  if (absl::Status s = CheckFinite(pseudo_grad, fl::StrCat(name(), " pseudo-gradient")); !s.ok()) return s;
  StepValidated(global, pseudo_grad);
  ++step_count_;
  return absl::OkStatus();
}

ServerOptimizerState ServerOptimizer::ExportState() const {
  ServerOptimizerState state;
  state.optimizer = std::string(name());
  state.step_count = step_count_;
  state.buffers = buffers_;
  return state;
}

absl::Status ServerOptimizer::ImportState(const ServerOptimizerState& state) {
  if (state.optimizer != name()) {
    return absl::InvalidArgumentError(fl::StrCat("cannot import a '", state.optimizer, "' state into a '", name(),
                                                 "' optimizer; restart with the optimizer the checkpoint was "
                                                 "written with, or start its state afresh"));
  }
  // Map every expected buffer to exactly one imported one before copying anything.
  std::vector<const NamedBuffer*> found(buffer_specs_.size(), nullptr);
  for (const NamedBuffer& b : state.buffers) {
    auto it = std::find_if(buffer_specs_.begin(), buffer_specs_.end(),
                           [&](const BufferSpec& spec) { return spec.name == b.name; });
    if (it == buffer_specs_.end()) {
      std::string expected;
      for (const BufferSpec& spec : buffer_specs_) {
        expected += fl::StrCat(expected.empty() ? "" : ", ", "'", spec.name, "'");
      }
      return absl::InvalidArgumentError(fl::StrCat(name(), " state has an unknown buffer '", b.name, "'; expected ",
                                                   expected.empty() ? "none" : expected));
    }
    const size_t index = static_cast<size_t>(it - buffer_specs_.begin());
    if (found[index] != nullptr) {
      return absl::InvalidArgumentError(
          fl::StrCat(name(), " state has buffer '", b.name, "' twice; the checkpoint is corrupt"));
    }
    const std::string what = fl::StrCat(name(), " state buffer '", b.name, "'");
    if (b.values.size() != num_params_) {
      return absl::InvalidArgumentError(fl::StrCat(what, " has ", b.values.size(), " values but the optimizer has ",
                                                   num_params_, " parameters; the checkpoint is for another model"));
    }
    if (absl::Status s = CheckFinite(b.values, what); !s.ok()) return s;
    if (absl::Status s = ValidateBuffer(index, b.values); !s.ok()) return s;
    found[index] = &b;
  }
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i] == nullptr) {
      return absl::InvalidArgumentError(
          fl::StrCat(name(), " state lacks buffer '", buffer_specs_[i].name, "'; the checkpoint is incomplete"));
    }
  }
  for (size_t i = 0; i < found.size(); ++i) buffers_[i].values = found[i]->values;
  step_count_ = state.step_count;
  return absl::OkStatus();
}

void ServerOptimizer::Reset() {
  step_count_ = 0;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    std::fill(buffers_[i].values.begin(), buffers_[i].values.end(), buffer_specs_[i].initial_value);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Configs

absl::Status FedAvgConfig::Validate() const { return CheckLr("fedavg", lr, "1.0 makes the new model the aggregate"); }

absl::Status FedAvgMConfig::Validate() const {
  if (absl::Status s = CheckLr("fedavgm", lr, "Hsu et al. use 1.0"); !s.ok()) return s;
  return CheckMomentum("fedavgm", momentum);
}

FedOptConfig FedOptConfig::Adam() { return FedOptConfig{FedOptVariant::kAdam, 0.1, 0.9, 0.99, 1e-9, 0.0}; }
FedOptConfig FedOptConfig::Yogi() { return FedOptConfig{FedOptVariant::kYogi, 0.01, 0.9, 0.99, 1e-3, 0.0}; }
FedOptConfig FedOptConfig::Adagrad() { return FedOptConfig{FedOptVariant::kAdagrad, 0.1, 0.0, 0.0, 1e-9, 0.0}; }

absl::Status FedOptConfig::Validate() const {
  const std::string_view opt = VariantName(variant);
  if (absl::Status s = CheckLr(opt, lr, "Reddi et al. tune it per task; Flower's default is 0.1, 0.01 for Yogi");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange(opt, "beta1", beta1, 0.0, true, 1.0, false, "0.9 is usual; 0 disables momentum");
      !s.ok()) {
    return s;
  }
  if (variant != FedOptVariant::kAdagrad) {
    if (absl::Status s = CheckRange(opt, "beta2", beta2, 0.0, true, 1.0, false, "0.99 is usual"); !s.ok()) return s;
  }
  if (absl::Status s = CheckRange(opt, "tau", tau, 0.0, false, kInf, false,
                                  "it keeps m / (sqrt(v) + tau) finite when v is 0; 1e-9 to 1e-3 are usual");
      !s.ok()) {
    return s;
  }
  return CheckRange(opt, "initial_v", initial_v, 0.0, true, kInf, false,
                    "a second moment cannot be negative; the paper suggests >= tau^2");
}

absl::Status NesterovConfig::Validate() const {
  if (absl::Status s = CheckLr("nesterov", lr, "DiLoCo uses 0.7"); !s.ok()) return s;
  return CheckMomentum("nesterov", momentum);
}

// ---------------------------------------------------------------------------------------------------------
// Optimizers. The loops are elementwise and branch-free so that they vectorize; they run once per round.

FedAvgOptimizer::FedAvgOptimizer(size_t num_params, const FedAvgConfig& config)
    : ServerOptimizer(num_params, {}), config_(config) {}

std::string FedAvgOptimizer::DescribeConfig() const { return fl::StrCat("lr=", config_.lr); }

void FedAvgOptimizer::StepValidated(std::span<float> global, std::span<const float> g) {
  const float lr = static_cast<float>(config_.lr);
  for (size_t i = 0; i < global.size(); ++i) global[i] -= lr * g[i];
}

FedAvgMOptimizer::FedAvgMOptimizer(size_t num_params, const FedAvgMConfig& config)
    : ServerOptimizer(num_params, {{"momentum", 0.0f}}), config_(config) {}

std::string FedAvgMOptimizer::DescribeConfig() const {
  return fl::StrCat("lr=", config_.lr, " momentum=", config_.momentum);
}

void FedAvgMOptimizer::StepValidated(std::span<float> global, std::span<const float> g) {
  const float lr = static_cast<float>(config_.lr);
  const float mu = static_cast<float>(config_.momentum);
  float* v = buffer(0).data();
  for (size_t i = 0; i < global.size(); ++i) {
    v[i] = mu * v[i] + g[i];
    global[i] -= lr * v[i];
  }
}

FedOptOptimizer::FedOptOptimizer(size_t num_params, const FedOptConfig& config)
    : ServerOptimizer(num_params, {{"m", 0.0f}, {"v", static_cast<float>(config.initial_v)}}), config_(config) {}

std::string_view FedOptOptimizer::name() const { return VariantName(config_.variant); }

std::string FedOptOptimizer::DescribeConfig() const {
  if (config_.variant == FedOptVariant::kAdagrad) {
    return fl::StrCat("lr=", config_.lr, " beta1=", config_.beta1, " tau=", config_.tau,
                      " initial_v=", config_.initial_v);
  }
  return fl::StrCat("lr=", config_.lr, " beta1=", config_.beta1, " beta2=", config_.beta2, " tau=", config_.tau,
                    " initial_v=", config_.initial_v);
}

absl::Status FedOptOptimizer::ValidateBuffer(size_t index, std::span<const float> values) const {
  if (index != 1) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0.0f) {
      return absl::InvalidArgumentError(fl::StrCat(name(), " state buffer 'v' holds ", values[i], " at element ", i,
                                                   "; a second moment is never negative: the checkpoint is corrupt"));
    }
  }
  return absl::OkStatus();
}

namespace {
// One loop per variant, the second-moment rule as a template parameter, so that no branch on the
// variant sits in the loop.
template <typename SecondMoment>
void FedOptLoop(std::span<float> global, std::span<const float> g, float* m, float* v, float lr, float beta1, float tau,
                SecondMoment update_v) {
  const float one_minus_beta1 = 1.0f - beta1;
  for (size_t i = 0; i < global.size(); ++i) {
    const float delta = -g[i];  // FedOpt's Delta = aggregate - theta
    m[i] = beta1 * m[i] + one_minus_beta1 * delta;
    v[i] = update_v(v[i], delta * delta);
    global[i] += lr * m[i] / (std::sqrt(v[i]) + tau);
  }
}
}  // namespace

void FedOptOptimizer::StepValidated(std::span<float> global, std::span<const float> g) {
  const float lr = static_cast<float>(config_.lr);
  const float beta1 = static_cast<float>(config_.beta1);
  const float tau = static_cast<float>(config_.tau);
  const float one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  const float beta2 = static_cast<float>(config_.beta2);
  float* m = buffer(0).data();
  float* v = buffer(1).data();
  switch (config_.variant) {
    case FedOptVariant::kAdam:
      FedOptLoop(global, g, m, v, lr, beta1, tau,
                 [=](float vi, float d2) { return beta2 * vi + one_minus_beta2 * d2; });
      break;
    case FedOptVariant::kYogi:
      // v - (1 - beta2) d2 sign(v - d2), sign(0) = 0 as numpy's: v moves towards d2 by a fixed fraction of
      // d2, never overshooting below 0 (Reddi et al. 2020, Algorithm 2).
      FedOptLoop(global, g, m, v, lr, beta1, tau, [=](float vi, float d2) {
        const float diff = vi - d2;
        const float sign = static_cast<float>(diff > 0.0f) - static_cast<float>(diff < 0.0f);
        return vi - one_minus_beta2 * d2 * sign;
      });
      break;
    case FedOptVariant::kAdagrad:
      FedOptLoop(global, g, m, v, lr, beta1, tau, [](float vi, float d2) { return vi + d2; });
      break;
  }
}

NesterovOptimizer::NesterovOptimizer(size_t num_params, const NesterovConfig& config)
    : ServerOptimizer(num_params, {{"momentum", 0.0f}}), config_(config) {}

std::string NesterovOptimizer::DescribeConfig() const {
  return fl::StrCat("lr=", config_.lr, " momentum=", config_.momentum);
}

void NesterovOptimizer::StepValidated(std::span<float> global, std::span<const float> g) {
  // PyTorch SGD(momentum=mu, nesterov=True, dampening=0): its first step sets buf = g, which is what
  // mu * 0 + g gives, so a zero-initialised buffer matches it exactly.
  const float lr = static_cast<float>(config_.lr);
  const float mu = static_cast<float>(config_.momentum);
  float* buf = buffer(0).data();
  for (size_t i = 0; i < global.size(); ++i) {
    buf[i] = mu * buf[i] + g[i];
    global[i] -= lr * (g[i] + mu * buf[i]);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Factories

namespace {

struct OptionField {
  std::string_view key;
  double* value;
};

absl::Status ApplyOptions(std::string_view optimizer, const ServerOptimizerOptions& options,
                          std::span<const OptionField> fields) {
  for (const auto& [key, value] : options) {
    // `name`, not `key` captured: clang 14 (the clang-tsa preset) cannot capture a structured binding.
    auto it = std::find_if(fields.begin(), fields.end(), [&name = key](const OptionField& f) { return f.key == name; });
    if (it == fields.end()) {
      std::string accepted;
      for (const OptionField& f : fields) accepted += fl::StrCat(accepted.empty() ? "" : ", ", f.key);
      return absl::InvalidArgumentError(
          fl::StrCat("server optimizer '", optimizer, "' has no option '", key, "'; it takes: ", accepted));
    }
    *it->value = value;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerOptimizer>> MakeServerOptimizer(std::string_view name,
                                                                     const ServerOptimizerOptions& options,
                                                                     size_t num_params) {
  if (name == "fedavg") {
    FedAvgConfig c;
    const OptionField fields[] = {{"lr", &c.lr}};
    if (absl::Status s = ApplyOptions(name, options, fields); !s.ok()) return s;
    if (absl::Status s = c.Validate(); !s.ok()) return s;
    return std::make_unique<FedAvgOptimizer>(num_params, c);
  }
  if (name == "fedavgm") {
    FedAvgMConfig c;
    const OptionField fields[] = {{"lr", &c.lr}, {"momentum", &c.momentum}};
    if (absl::Status s = ApplyOptions(name, options, fields); !s.ok()) return s;
    if (absl::Status s = c.Validate(); !s.ok()) return s;
    return std::make_unique<FedAvgMOptimizer>(num_params, c);
  }
  if (name == "fedadam" || name == "fedyogi" || name == "fedadagrad") {
    FedOptConfig c = name == "fedadam"   ? FedOptConfig::Adam()
                     : name == "fedyogi" ? FedOptConfig::Yogi()
                                         : FedOptConfig::Adagrad();
    absl::Status s;
    if (c.variant == FedOptVariant::kAdagrad) {
      const OptionField fields[] = {{"lr", &c.lr}, {"beta1", &c.beta1}, {"tau", &c.tau}, {"initial_v", &c.initial_v}};
      s = ApplyOptions(name, options, fields);
    } else {
      const OptionField fields[] = {
          {"lr", &c.lr}, {"beta1", &c.beta1}, {"beta2", &c.beta2}, {"tau", &c.tau}, {"initial_v", &c.initial_v}};
      s = ApplyOptions(name, options, fields);
    }
    if (!s.ok()) return s;
    if (s = c.Validate(); !s.ok()) return s;
    return std::make_unique<FedOptOptimizer>(num_params, c);
  }
  if (name == "nesterov" || name == "diloco") {
    NesterovConfig c;
    const OptionField fields[] = {{"lr", &c.lr}, {"momentum", &c.momentum}};
    if (absl::Status s = ApplyOptions("nesterov", options, fields); !s.ok()) return s;
    if (absl::Status s = c.Validate(); !s.ok()) return s;
    return std::make_unique<NesterovOptimizer>(num_params, c);
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown server optimizer '", name,
                                               "'; expected one of: fedavg, fedavgm, fedadam, fedyogi, fedadagrad, "
                                               "nesterov (alias diloco)"));
}

absl::StatusOr<std::unique_ptr<ServerOptimizer>> MakeServerOptimizer(std::string_view spec, size_t num_params) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  ServerOptimizerOptions options;
  if (colon != std::string_view::npos) {
    std::string_view rest = spec.substr(colon + 1);
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      const size_t eq = item.find('=');
      double value = 0.0;
      if (eq == std::string_view::npos || eq == 0 ||
          !absl::SimpleAtod(absl::string_view(item.data() + eq + 1, item.size() - eq - 1), &value)) {
        return absl::InvalidArgumentError(fl::StrCat("server optimizer '", spec, "': '", item,
                                                     "' is not key=number; write e.g. fedadam:lr=0.03,tau=1e-3"));
      }
      const std::string key(item.substr(0, eq));
      if (!options.emplace(key, value).second) {
        return absl::InvalidArgumentError(fl::StrCat("server optimizer '", spec, "' sets '", key, "' twice; keep one"));
      }
    }
  }
  return MakeServerOptimizer(name, options, num_params);
}

}  // namespace fl::core

// The island runtime: inner steps with c10d gradient all-reduce, the DiLoCo / Streaming DiLoCo outer loop
// on the leader, and the data-parallel baseline. The only LibTorch translation unit besides train_task.cc.
// Why one file of this size: each LibTorch translation unit costs ~25 s to compile; the runtime's parts share
// the c10d process group and the model, so they stay in one unit instead of three slow ones.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
// Compiled where LibTorch is a CUDA build (CMakeLists.txt), and by the compile check against a CUDA
// toolkit's headers where it is not; never reached at run time without a GPU (ChooseDevice).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>

#include "fl/core/checksum.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/coord/coordinator_client.h"
#include "fl/diloco/island/exchange.h"
#include "fl/diloco/island/island.h"
#include "fl/diloco/island/onebit_membership.h"
#include "fl/diloco/coord/state_transfer.h"
#include "train_task.h"

namespace fl::diloco {
namespace {

// The ring's settings every island takes from the coordinator's schedule (DiLoCo's and 1-bit Adam's admission).
void TakeRingSettings(const IslandSchedule& s, ExchangeConfig& c) {
  c.codec = s.codec;
  c.error_feedback = s.error_feedback;
  c.connections_per_peer = static_cast<int>(s.connections_per_peer);
  c.timeout = absl::Milliseconds(s.exchange_timeout_ms);
}

// LibTorch 2.x made Gloo and NCCL c10d::Backends of a ProcessGroup; in 1.x (Debian 12's 1.13) they are
// ProcessGroups. The collectives used here (allreduce, broadcast) have the same signature on both.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Control word the leader broadcasts to its ranks at every apply step.
enum ControlKind : int64_t { kFragment = 0, kFullModel = 1, kStop = 2 };

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(fl::StrCat("pg_store '", address, "' is not host:port (e.g. 127.0.0.1:29500)"));
  }
  const int port = std::atoi(address.c_str() + colon + 1);
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(fl::StrCat("pg_store '", address, "' has no valid port (1..65535)"));
  }
  return std::make_pair(address.substr(0, colon), static_cast<uint16_t>(port));
}

// A c10d process group of `size` ranks: Gloo on the CPU, NCCL on CUDA (ChooseDevice picks CUDA only
// where this build has NCCL).
absl::StatusOr<c10::intrusive_ptr<CollectiveGroup>> MakeProcessGroup(const std::string& store_address, size_t rank,
                                                                     size_t size, bool cuda) {
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(store_address);
  if (!hp.ok()) return hp.status();
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = hp->second;
    store_options.isServer = rank == 0;
    store_options.numWorkers = size;
    store_options.waitWorkers = true;
    store_options.timeout = std::chrono::minutes(5);
    auto store = c10::make_intrusive<c10d::TCPStore>(hp->first, store_options);
    if (cuda) {
#ifdef USE_C10D_NCCL
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = std::chrono::minutes(30);
      return c10::intrusive_ptr<CollectiveGroup>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank), static_cast<int>(size), options));
#else
      return absl::FailedPreconditionError("this LibTorch build has no NCCL process group; use --device cpu");
#endif
    }
    auto options = c10d::ProcessGroupGloo::Options::create();
    options->timeout = std::chrono::minutes(30);
    options->devices.push_back(hp->first == "127.0.0.1" || hp->first == "localhost"
                                   ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
    return c10::intrusive_ptr<CollectiveGroup>(
        c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(fl::StrCat("process group rendezvous at ", store_address, " (rank ", rank, " of ",
                                             size, ") failed: ", e.what()));
  }
}

void Broadcast(CollectiveGroup& pg, torch::Tensor& tensor) {
  std::vector<at::Tensor> v{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = 0;
  pg.broadcast(v, o)->wait();
}

void AllReduceMean(CollectiveGroup& pg, torch::Tensor& flat, size_t size) {
  std::vector<at::Tensor> v{flat};
  pg.allreduce(v)->wait();
  flat.div_(static_cast<double>(size));
}

// Broadcast from rank 0 of a host tensor (the control words, the schedule, a fragment, the whole model).
// Gloo (CPU) broadcasts it in place, as it always did. NCCL takes device tensors only, for every
// collective however small: on CUDA the tensor goes through a device copy and comes back.
void BroadcastHost(CollectiveGroup& pg, torch::Tensor& host, const torch::Device& device) {
  if (device.is_cpu()) {
    Broadcast(pg, host);
    return;
  }
  torch::Tensor on_device = host.to(device);
  Broadcast(pg, on_device);
  host.copy_(on_device);  // ordered after the broadcast: wait() made the current stream wait on NCCL's
}

// "cuda:<device name>" for the coordinator's records; only CUDA builds (NCCL) ever train on a GPU.
std::string AcceleratorName(int index) {
#ifdef USE_C10D_NCCL
  return fl::StrCat("cuda:", at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name);
#else
  return fl::StrCat("cuda:", index);
#endif
}

torch::Tensor FlatGrads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> parts;
  parts.reserve(params.size());
  for (const torch::Tensor& p : params) {
    parts.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  return torch::cat(parts);
}

void SetGrads(const torch::Tensor& flat, const std::vector<torch::Tensor>& params) {
  int64_t k = 0;
  for (const torch::Tensor& p : params) {
    const int64_t n = p.numel();
    torch::Tensor g = flat.slice(0, k, k + n).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(g);
    } else {
      p.mutable_grad() = g.clone();
    }
    k += n;
  }
}

class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path) {
    if (!path.empty()) out_.open(path, std::ios::app);
  }
  void Line(const std::string& json) {
    if (out_.is_open()) out_ << json << "\n" << std::flush;
  }

 private:
  std::ofstream out_;
};

// Everything one rank holds while it trains.
class IslandRun {
 public:
  explicit IslandRun(const IslandOptions& o) : o_(o), metrics_(o.rank == 0 ? o.metrics_path : "") {}

  absl::StatusOr<IslandSummary> Run();

 private:
  bool leader() const { return o_.rank == 0; }
  // This island's side of mutual TLS (to the coordinator, to other islands' state servers).
  rpc::ClientTls ClientTls() const {
    rpc::ClientTls tls;
    tls.ca_file = o_.tls_ca;
    tls.cert_file = o_.tls_cert;
    tls.key_file = o_.tls_key;
    return tls;
  }
  absl::Status Setup();
  absl::Status SetupLeader();
  absl::StatusOr<Assignment> ConnectToCoordinator();
  absl::Status InnerStep(uint64_t step);
  double LearningRate(uint64_t step) const;
  absl::StatusOr<double> Backward(uint64_t step);
  absl::Status ApplyAt(uint64_t step, size_t fragment, uint64_t* resume_step);
  absl::Status LoadState(const StateSource& source);
  absl::Status RunDataParallel();
  absl::Status RunOneBitAdam();
  absl::Status RunEveryStep(absl::Status (IslandRun::*step)(uint64_t));
  absl::Status OneBitStep(uint64_t step);
  absl::Status OneBitStepIn(uint64_t step, absl::Status* ring_failure);
  absl::Status RunOneBitWindows();
  absl::Status SetupOneBitLeader();
  absl::Status LoadOneBitState(const StateSource& source);
  // Evicted (`why`): rejoin through the coordinator and load the state it names with `load` (DiLoCo's or 1-bit
  // Adam's); the key of that state, after which the island continues, or why not.
  absl::StatusOr<SyncKey> RejoinWithState(const absl::Status& why,
                                          const std::function<absl::Status(const StateSource&)>& load);
  absl::Status ShareWindowControl(int64_t* kind, uint64_t* next_step);
  absl::Status StartStaticRingExchanger(const std::string& codec);
  absl::Status RunDiLoCo();
  void Eval(uint64_t step);

  IslandOptions o_;
  MetricsLog metrics_;
  DeviceChoice device_;
  torch::Device torch_device_{torch::kCPU};  // the model, optimizer state, batches and c10d tensors
  std::unique_ptr<TrainTask> task_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<ParamStaging> staging_;  // params_ <-> the host image (local_, θ_global)
  std::shared_ptr<const core::ModelSpec> spec_;
  std::unique_ptr<torch::optim::AdamW> inner_;
  c10::intrusive_ptr<CollectiveGroup> island_pg_;  // null when R = 1
  c10::intrusive_ptr<CollectiveGroup> global_pg_;  // data-parallel baseline over one c10d group
  size_t global_size_ = 1;
  std::vector<float> local_;
  // 1-bit Adam / data-parallel Adam (every rank holds the optimizer state; the leader exchanges)
  std::optional<OneBitAdam> onebit_;
  std::string onebit_warmup_codec_;       // the warm-up's gradient codec (the coordinator's, or --codec)
  uint64_t window_steps_ = 0;             // K: steps per membership window (with a coordinator)
  bool window_error_feedback_ = false;    // the coordinator's: residuals to fold at a window's end
  std::vector<uint8_t> committed_image_;  // leader: the last committed state, a failed window's rollback
  // DiLoCo
  std::optional<OuterState> outer_;
  std::optional<core::FragmentSchedule> schedule_;  // every rank
  std::optional<core::FragmentPlan> plan_;          // every rank
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<StateServer> state_server_;
  std::unique_ptr<Exchanger> exchanger_;
  uint64_t first_step_ = 0;
  uint64_t total_steps_ = 0;
  double compute_since_sync_s_ = 0;
  uint64_t steps_since_sync_ = 0;
  IslandSummary summary_;
};

absl::Status IslandRun::Setup() {
  absl::StatusOr<DeviceChoice> device = ResolveDevice(o_.device, o_.device_slot(), o_.cuda_device);
  if (!device.ok()) return device.status();
  device_ = *device;
  if (device_.cuda) {
    torch_device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_.index));
#ifdef USE_C10D_NCCL
    // NCCL's communicators and LibTorch's allocator and streams use the current device: without this
    // every rank would also open a context on GPU 0.
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_.index));
#endif
    spdlog::info("{} rank {}: device {} ({}) — {}", o_.island_id, o_.rank, device_.Name(),
                 AcceleratorName(device_.index), device_.reason);
  } else {
    spdlog::info("{} rank {}: device cpu — {}", o_.island_id, o_.rank, device_.reason);
  }
  if (o_.threads > 0) torch::set_num_threads(o_.threads);
  TaskOptions t;
  t.model = o_.model;
  t.data_dir = o_.data_dir;
  t.data = o_.data;
  t.task = o_.task;
  t.shard = o_.shard;
  t.num_shards = o_.num_shards;
  t.rank = o_.rank;
  t.seed = o_.seed;
  t.batch_size = o_.batch_size;
  t.context = o_.context;
  t.d_model = o_.d_model;
  t.num_layers = o_.num_layers;
  t.num_heads = o_.num_heads;
  t.device = torch_device_;
  absl::StatusOr<std::unique_ptr<TrainTask>> task = CreateTrainTask(t);
  if (!task.ok()) return task.status();
  task_ = std::move(*task);
  params_ = task_->parameters();  // on torch_device_: AdamW keeps its moments next to them
  staging_ = std::make_unique<ParamStaging>(params_, torch_device_);
  spec_ = std::make_shared<const core::ModelSpec>(task_->spec());
  local_.assign(spec_->num_elements(), 0.0f);
  staging_->ToHost(local_);
  inner_ = std::make_unique<torch::optim::AdamW>(
      params_, torch::optim::AdamWOptions(o_.inner_lr).weight_decay(o_.weight_decay).betas({o_.beta1, o_.beta2}));
  if (o_.mode == "data-parallel" && o_.dp_transport == "gloo") {
    global_size_ = o_.num_shards * o_.ranks;
    absl::StatusOr<c10::intrusive_ptr<CollectiveGroup>> pg =
        MakeProcessGroup(o_.pg_store, o_.shard * o_.ranks + o_.rank, global_size_, device_.cuda);
    if (!pg.ok()) return pg.status();
    global_pg_ = *pg;
  } else if (o_.ranks > 1) {
    absl::StatusOr<c10::intrusive_ptr<CollectiveGroup>> pg =
        MakeProcessGroup(o_.pg_store, o_.rank, o_.ranks, device_.cuda);
    if (!pg.ok()) return pg.status();
    island_pg_ = *pg;
  }
  summary_.island_id = o_.island_id;
  summary_.mode = o_.mode;
  total_steps_ = o_.total_steps;
  return absl::OkStatus();
}

// The inner learning rate at `step`: a linear warm-up from 0 over warmup_steps.
double IslandRun::LearningRate(uint64_t step) const {
  const double warm = o_.warmup_steps == 0 ? 1.0 : std::min(1.0, static_cast<double>(step) / o_.warmup_steps);
  return o_.inner_lr * warm;
}

// Forward and backward on this rank's next batch (gradients accumulate into the parameters'); the loss, which
// must be finite.
absl::StatusOr<double> IslandRun::Backward(uint64_t step) {
  torch::Tensor loss = task_->NextTrainLoss();
  loss.backward();
  const double loss_value = loss.item<double>();
  if (!std::isfinite(loss_value)) {
    return absl::InternalError(
        fl::StrCat("training loss is ", loss_value, " at step ", step, "; lower --inner-lr (now ", o_.inner_lr, ")"));
  }
  return loss_value;
}

absl::Status IslandRun::InnerStep(uint64_t step) {
  const auto start = Clock::now();
  for (auto& group : inner_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(LearningRate(step));
  }
  inner_->zero_grad();
  absl::StatusOr<double> loss = Backward(step);
  if (!loss.ok()) return loss.status();
  const double loss_value = *loss;
  if (island_pg_) {
    torch::Tensor g = FlatGrads(params_);
    AllReduceMean(*island_pg_, g, o_.ranks);
    SetGrads(g, params_);
  }
  if (global_pg_ || (o_.mode == "data-parallel" && o_.dp_transport == "ring")) {
    // The baseline's cross-island all-reduce: everything here is waiting on the network.
    const auto net_start = Clock::now();
    torch::Tensor g = FlatGrads(params_).contiguous();
    if (global_pg_) {
      AllReduceMean(*global_pg_, g, global_size_);
      // Gloo does not count bytes: charge the ring algorithm's 2(W-1)/W of the fp32 gradient per rank.
      const uint64_t bytes = static_cast<uint64_t>(2.0 * (global_size_ - 1) / global_size_ * g.numel() * 4.0);
      summary_.bytes_sent += bytes;
      summary_.bytes_received += bytes;
      summary_.peak_sync_bytes = std::max(summary_.peak_sync_bytes, bytes);
    } else {
      if (leader()) {
        // The ring is host code: on a GPU the gradient goes down and comes back (on the CPU, g itself).
        torch::Tensor host = torch_device_.is_cpu() ? g : g.to(torch::kCPU);
        std::vector<float> values(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
        if (absl::Status s = exchanger_->Start(SyncKey{step, 0}, std::move(values)); !s.ok()) return s;
        ExchangeOutcome out = exchanger_->Wait();
        if (out.kind != ExchangeOutcome::Kind::kAveraged) return out.error;
        std::memcpy(host.data_ptr<float>(), out.values.data(), out.values.size() * sizeof(float));
        if (!torch_device_.is_cpu()) g.copy_(host);
        summary_.bytes_sent += out.bytes_sent;
        summary_.bytes_received += out.bytes_received;
        summary_.peak_sync_bytes = std::max(summary_.peak_sync_bytes, out.bytes_sent);
        summary_.exchange_s += out.exchange_seconds;
      }
      if (island_pg_) Broadcast(*island_pg_, g);
    }
    SetGrads(g, params_);
    summary_.wait_s += Since(net_start);
    ++summary_.syncs;
  }
  inner_->step();
  const double seconds = Since(start);
  summary_.compute_s += seconds;
  compute_since_sync_s_ += seconds;
  ++steps_since_sync_;
  ++summary_.steps;
  summary_.units += task_->units_per_batch() * o_.ranks;
  if (leader() && step % 50 == 0) {
    spdlog::debug("{} step {} loss {:.4f}", o_.island_id, step, loss_value);
  }
  return absl::OkStatus();
}

void IslandRun::Eval(uint64_t step) {
  const double loss = task_->EvalLoss();
  spdlog::info("{} step {} eval loss {:.4f}", o_.island_id, step, loss);
  metrics_.Line(fl::StrCat("{\"event\":\"eval\",\"island\":\"", o_.island_id, "\",\"step\":", step,
                           ",\"eval_loss\":", loss, "}"));
}

// The leader's exchanger over the static ring (--peer), for the modes that exchange every step.
absl::Status IslandRun::StartStaticRingExchanger(const std::string& codec) {
  ExchangeConfig c;
  c.self_id = o_.island_id;
  c.bind_endpoint = o_.data_endpoint;
  for (const std::string& p : o_.peers) {
    const size_t eq = p.find('=');
    c.static_peers.push_back(RingMember{p.substr(0, eq), p.substr(eq + 1)});
  }
  c.codec = codec;
  c.sync_mode = o_.mode;
  c.error_feedback = o_.error_feedback;
  c.connections_per_peer = o_.connections_per_peer;
  if (o_.secured()) c.curve_dir = o_.CurveDir();
  c.timeout = absl::Seconds(o_.exchange_timeout_s);
  exchanger_ = std::make_unique<Exchanger>(std::move(c), nullptr);
  return absl::OkStatus();
}

absl::Status IslandRun::RunDataParallel() {
  if (o_.dp_transport == "ring" && leader()) {
    if (absl::Status s = StartStaticRingExchanger("fp32"); !s.ok()) return s;
  }
  return RunEveryStep(&IslandRun::InnerStep);
}

// The loop of the modes that exchange every step (data-parallel, onebit-adam) and what their summary ends with.
absl::Status IslandRun::RunEveryStep(absl::Status (IslandRun::*step)(uint64_t)) {
  const auto start = Clock::now();
  for (uint64_t t = 1; t <= total_steps_; ++t) {
    if (absl::Status s = (this->*step)(t); !s.ok()) return s;
    if (leader() && o_.eval_every > 0 && t % o_.eval_every == 0 && t < total_steps_) Eval(t);
  }
  summary_.wall_s = Since(start);
  staging_->ToHost(local_);
  summary_.local_model_hash = core::Checksum64(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(local_.data()), local_.size() * sizeof(float)));
  if (leader()) {
    summary_.final_eval_loss = task_->EvalLoss();
    summary_.final_local_eval_loss = summary_.final_eval_loss;
  }
  return absl::OkStatus();
}

// One step of 1-bit Adam (or, during its warm-up and with W = T, of data-parallel Adam): the island's mean
// gradient (c10d), the leader's exchange over the ring (the gradient in warm-up, the local momentum after),
// the result broadcast to the island's ranks, and the same optimizer arithmetic on every rank.
absl::Status IslandRun::OneBitStep(uint64_t step) { return OneBitStepIn(step, nullptr); }

// `ring_failure` null: a failed exchange fails the step (static ring). Set (a membership window): a failed
// exchange is written there (ranks: Aborted), nothing is applied, and the step returns OK so that the window
// can be reported failed and rolled back.
absl::Status IslandRun::OneBitStepIn(uint64_t step, absl::Status* ring_failure) {
  const auto start = Clock::now();
  const double lr = LearningRate(step);
  for (torch::Tensor& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  absl::StatusOr<double> loss = Backward(step);
  if (!loss.ok()) return loss.status();
  const double loss_value = *loss;
  torch::Tensor g = FlatGrads(params_).contiguous();
  if (island_pg_) AllReduceMean(*island_pg_, g, o_.ranks);
  torch::Tensor host = torch_device_.is_cpu() ? g : g.to(torch::kCPU);
  const size_t n = local_.size();
  std::span<const float> grad(host.data_ptr<float>(), n);
  const bool compressed = onebit_->NextStepCompressed();
  // The exchanged vector and, after it, whether the leader's exchange succeeded (1) or not (0), in one broadcast.
  torch::Tensor exchanged = torch::empty({static_cast<int64_t>(n) + 1}, torch::kFloat32);
  std::span<float> mean(exchanged.data_ptr<float>(), n);
  exchanged[static_cast<int64_t>(n)] = 1.0f;
  const auto net_start = Clock::now();
  double waited = 0;
  if (leader()) {
    std::vector<float> send(n);
    // The codec follows the stage, not the step number: a late joiner, or a window run again after a rollback,
    // starts its ring in whichever stage the state is in.
    const std::string codec = compressed ? onebit_->options().CompressedCodec() : onebit_warmup_codec_;
    if (exchanger_->codec() != codec) {
      if (absl::Status s = exchanger_->SetCodec(codec); !s.ok()) return s;
      if (compressed) {
        spdlog::info("{}: step {}: variance frozen after {} warm-up steps; momentum in {} from now on", o_.island_id,
                     step, o_.onebit_warmup_steps, codec);
      }
    }
    if (compressed) {
      if (absl::Status s = onebit_->LocalMomentum(grad, send); !s.ok()) return s;
    } else {
      std::copy(grad.begin(), grad.end(), send.begin());
    }
    const auto net = Clock::now();
    const SyncKey key{step, static_cast<uint32_t>(compressed ? kOneBitMomentumKey : kOneBitGradientKey)};
    if (absl::Status s = exchanger_->Start(key, std::move(send)); !s.ok()) return s;
    ExchangeOutcome out = exchanger_->Wait();
    waited = Since(net);
    summary_.bytes_sent += out.bytes_sent;
    summary_.bytes_received += out.bytes_received;
    summary_.exchange_s += out.exchange_seconds;
    if (out.kind != ExchangeOutcome::Kind::kAveraged) {
      if (ring_failure == nullptr) return out.error;
      *ring_failure = out.error;
      exchanged[static_cast<int64_t>(n)] = 0.0f;
    } else {
      std::copy(out.values.begin(), out.values.end(), mean.begin());
      summary_.peak_sync_bytes = std::max(summary_.peak_sync_bytes, out.bytes_sent);
    }
  }
  if (island_pg_) BroadcastHost(*island_pg_, exchanged, torch_device_);
  if (!leader()) waited = Since(net_start);
  summary_.wait_s += waited;
  if (exchanged[static_cast<int64_t>(n)].item<float>() == 0.0f) {
    if (!leader() && ring_failure != nullptr) *ring_failure = absl::AbortedError("the leader's exchange failed");
    return absl::OkStatus();
  }
  absl::Status applied = compressed ? onebit_->CompressedStep(mean, lr, local_) : onebit_->AdamStep(mean, lr, local_);
  if (!applied.ok()) return applied;
  staging_->FromHost(local_);
  ++summary_.syncs;
  const double seconds = Since(start) - waited;
  summary_.compute_s += seconds;
  compute_since_sync_s_ += seconds;
  ++steps_since_sync_;
  ++summary_.steps;
  summary_.units += task_->units_per_batch() * o_.ranks;
  if (leader() && step % 50 == 0) spdlog::debug("{} step {} loss {:.4f}", o_.island_id, step, loss_value);
  return absl::OkStatus();
}

absl::Status IslandRun::RunOneBitAdam() {
  inner_.reset();  // this mode steps the model itself (onebit_adam.h): no LibTorch optimizer state
  onebit_warmup_codec_ = o_.codec;
  if (!o_.coordinator.empty()) return RunOneBitWindows();
  absl::StatusOr<OneBitAdam> adam = OneBitAdam::Create(local_.size(), o_.OneBit());
  if (!adam.ok()) return adam.status();
  onebit_.emplace(std::move(*adam));
  if (leader()) {
    if (absl::Status s = StartStaticRingExchanger(o_.codec); !s.ok()) return s;
    if (o_.onebit_warmup_steps >= total_steps_) {
      spdlog::info("{}: data-parallel Adam, {} parameters, {} steps, gradients in {}", o_.island_id, local_.size(),
                   total_steps_, o_.codec);
    } else {
      spdlog::info("{}: 1-bit Adam, {} parameters, warm-up {} of {} steps in {}, then {}{}", o_.island_id,
                   local_.size(), o_.onebit_warmup_steps, total_steps_, o_.codec, onebit_->options().CompressedCodec(),
                   o_.error_feedback ? " + error feedback on both sides" : "");
    }
  }
  if (absl::Status s = RunEveryStep(&IslandRun::OneBitStep); !s.ok()) return s;
  summary_.state_hash = onebit_->Hash(local_);
  return absl::OkStatus();
}

// The leader's admission in onebit-adam: the coordinator's schedule fixes the window K (inner_steps), the run
// T = windows x K, the warm-up codec and the ring; a late joiner copies the committed state.
absl::Status IslandRun::SetupOneBitLeader() {
  absl::StatusOr<Assignment> assignment = ConnectToCoordinator();
  if (!assignment.ok()) return assignment.status();
  const IslandSchedule& s = assignment->schedule;
  if (s.total_outer_steps == 0) {
    return absl::InvalidArgumentError(
        "the coordinator runs until stopped (--outer-steps 0), but onebit-adam needs the run's length for its "
        "schedule; start fl-coordinator with --outer-steps = total steps / --inner-steps");
  }
  window_steps_ = s.inner_steps;
  window_error_feedback_ = s.error_feedback;
  total_steps_ = s.total_outer_steps * s.inner_steps;
  onebit_warmup_codec_ = s.codec;
  OneBitAdamOptions options = o_.OneBit();
  options.total_steps = total_steps_;
  absl::StatusOr<OneBitAdam> adam = OneBitAdam::Create(local_.size(), options);
  if (!adam.ok()) return adam.status();
  onebit_.emplace(std::move(*adam));
  ExchangeConfig c;
  c.self_id = o_.island_id;
  c.bind_endpoint = o_.data_endpoint;
  c.sync_mode = o_.mode;
  TakeRingSettings(s, c);
  if (o_.secured()) c.curve_dir = o_.CurveDir();
  exchanger_ = std::make_unique<Exchanger>(std::move(c), client_.get());
  committed_image_ = onebit_->Serialize(local_);
  spdlog::info(
      "{}: 1-bit Adam through the coordinator, {} parameters, warm-up {} of {} steps in {}, then {}{}, "
      "membership windows of {} steps",
      o_.island_id, local_.size(), o_.onebit_warmup_steps, total_steps_, s.codec, onebit_->options().CompressedCodec(),
      s.error_feedback ? " + error feedback" : "", window_steps_);
  if (assignment->state_source.has_value()) {
    if (absl::Status st = LoadOneBitState(*assignment->state_source); !st.ok()) return st;
    first_step_ = (assignment->state_source->key.step + 1) * window_steps_;
    summary_.late_joined = true;
  }
  return absl::OkStatus();
}

// A committed 1-bit Adam state from a peer (late join, repair, rejoin): copied over TLS, verified by restoring
// it into a scratch state and recomputing the hash, its residual checked to be the fold's zeros, reported.
absl::Status IslandRun::LoadOneBitState(const StateSource& source) {
  const auto start = Clock::now();
  FetchOptions fetch;
  fetch.verify = [this](std::span<const uint8_t> image) -> absl::StatusOr<uint64_t> {
    OneBitAdam copy = *onebit_;
    std::vector<float> params(local_.size());
    std::vector<float> residual;
    if (absl::Status s = copy.Restore(image, params, &residual); !s.ok()) return s;
    return copy.Hash(params, residual);
  };
  if (o_.secured()) {
    fetch.tls = ClientTls();
    fetch.peer_island = source.island_id;
  }
  absl::StatusOr<StateSnapshot> snap = FetchState(source.endpoint, source.expected_hash, fetch);
  if (!snap.ok()) return snap.status();
  std::vector<float> residual;
  if (absl::Status s = onebit_->Restore(snap->image, local_, &residual); !s.ok()) return s;
  if (std::any_of(residual.begin(), residual.end(), [](float r) { return r != 0.0f; })) {
    // A committed state is always folded; residuals of another island's ring cannot continue on this one.
    return absl::FailedPreconditionError(fl::StrCat("the state copied from ", source.island_id,
                                                    " carries error-feedback residuals; a committed 1-bit Adam "
                                                    "state is folded (all zero): run every island of one release"));
  }
  const uint64_t hash = onebit_->Hash(local_);
  if (hash != source.expected_hash) {
    return absl::DataLossError(fl::StrCat("state copied from ", source.island_id, " hashes to ",
                                          core::FingerprintToHex(hash), ", expected ",
                                          core::FingerprintToHex(source.expected_hash)));
  }
  exchanger_->DropResiduals();
  if (absl::Status s = client_->ReportStateLoaded(source.key, hash); !s.ok()) return s;
  committed_image_ = snap->image;
  if (state_server_) state_server_->Publish({source.key, hash, snap->image});
  const double ms = Since(start) * 1000.0;
  summary_.state_loads += 1;
  summary_.state_load_bytes += snap->image.size();
  summary_.state_load_ms += ms;
  spdlog::info("{} loaded the 1-bit Adam state after window {} (step {}) from {}: {} bytes in {:.1f} ms, hash {}",
               o_.island_id, source.key.step, onebit_->step(), source.island_id, snap->image.size(), ms,
               core::FingerprintToHex(hash));
  return absl::OkStatus();
}

// Leader -> ranks at a window boundary: what happens next (kind) and from which step; with kFullModel the
// leader's whole state image follows (a fold, a rollback, a copied state), which every rank restores.
absl::Status IslandRun::ShareWindowControl(int64_t* kind, uint64_t* next_step) {
  if (!island_pg_) return absl::OkStatus();
  torch::Tensor control = torch::zeros({2}, torch::kInt64);
  if (leader()) {
    control[0] = *kind;
    control[1] = static_cast<int64_t>(*next_step);
  }
  BroadcastHost(*island_pg_, control, torch_device_);
  *kind = control[0].item<int64_t>();
  *next_step = static_cast<uint64_t>(control[1].item<int64_t>());
  if (*kind != kFullModel) return absl::OkStatus();
  std::vector<uint8_t> image = onebit_->Serialize(local_);  // the ranks' own: the size the leader's will have
  torch::Tensor bytes = torch::from_blob(image.data(), {static_cast<int64_t>(image.size())}, torch::kUInt8);
  BroadcastHost(*island_pg_, bytes, torch_device_);
  if (!leader()) {
    if (absl::Status s = onebit_->Restore(image, local_); !s.ok()) return s;
    staging_->FromHost(local_);
  }
  return absl::OkStatus();
}

absl::StatusOr<SyncKey> IslandRun::RejoinWithState(const absl::Status& why,
                                                   const std::function<absl::Status(const StateSource&)>& load) {
  spdlog::warn("{}: evicted ({}); rejoining", o_.island_id, fl::ToStd(why.message()));
  exchanger_->ResetRing();
  absl::StatusOr<Assignment> assignment = client_->Rejoin();
  if (!assignment.ok()) return assignment.status();
  if (!assignment->state_source.has_value()) return absl::InternalError("rejoined without a state source");
  if (absl::Status s = load(*assignment->state_source); !s.ok()) return s;
  return assignment->state_source->key;
}

// 1-bit Adam admitted by fl-coordinator (onebit_membership.h): windows of K steps, each a coordinator sync with
// its own ring; the residuals folded and the state hashed and committed at each window's end; a failed window
// rolled back to the committed state and run again on the coordinator's next ring; late joiners and rejoiners
// copy the committed state.
absl::Status IslandRun::RunOneBitWindows() {
  torch::Tensor sched = torch::zeros({3}, torch::kInt64);
  if (leader()) {
    if (absl::Status s = SetupOneBitLeader(); !s.ok()) return s;
    sched[0] = static_cast<int64_t>(window_steps_);
    sched[1] = static_cast<int64_t>(total_steps_);
    sched[2] = static_cast<int64_t>(first_step_);
  }
  if (island_pg_) BroadcastHost(*island_pg_, sched, torch_device_);
  window_steps_ = static_cast<uint64_t>(sched[0].item<int64_t>());
  total_steps_ = static_cast<uint64_t>(sched[1].item<int64_t>());
  first_step_ = static_cast<uint64_t>(sched[2].item<int64_t>());
  if (!leader()) {
    OneBitAdamOptions options = o_.OneBit();
    options.total_steps = total_steps_;
    absl::StatusOr<OneBitAdam> adam = OneBitAdam::Create(local_.size(), options);
    if (!adam.ok()) return adam.status();
    onebit_.emplace(std::move(*adam));
  }
  int64_t kind = kFullModel;  // the ranks start from the leader's state (a late joiner's copied one)
  uint64_t t = first_step_;
  if (absl::Status s = ShareWindowControl(&kind, &t); !s.ok()) return s;
  staging_->FromHost(local_);
  summary_.first_step = first_step_;

  const auto start = Clock::now();
  while (t < total_steps_) {
    const uint64_t window = t / window_steps_;
    const uint64_t end = std::min((window + 1) * window_steps_, total_steps_);
    const SyncKey key{window, 0};
    uint64_t next = end;
    kind = kFragment;      // continue: nothing to copy to the ranks
    absl::Status failure;  // fatal: the leader stops its ranks and returns it
    absl::Status rejoin;   // the leader was evicted
    size_t ring_size = 0;
    const IslandSummary before = summary_;
    compute_since_sync_s_ = 0;
    steps_since_sync_ = 0;
    if (leader()) {
      absl::StatusOr<SyncPlan> plan = exchanger_->BeginWindow(key);
      if (!plan.ok()) {
        (IsRejoinNeeded(plan.status()) ? rejoin : failure) = plan.status();
      } else {
        ring_size = plan->members.size();
      }
    }
    // Whether the window runs at all (the leader's BeginWindow may have ended in an eviction or an error).
    int64_t go = rejoin.ok() && failure.ok() ? 1 : 0;
    if (island_pg_) {
      torch::Tensor flag = torch::full({1}, go, torch::kInt64);
      BroadcastHost(*island_pg_, flag, torch_device_);
      go = flag[0].item<int64_t>();
    }
    absl::Status ring_failure;
    if (go == 1) {
      for (uint64_t step = t + 1; step <= end && ring_failure.ok(); ++step) {
        if (absl::Status s = OneBitStepIn(step, &ring_failure); !s.ok()) return s;
        if (leader() && o_.eval_every > 0 && step % o_.eval_every == 0 && step < total_steps_ && ring_failure.ok()) {
          Eval(step);
        }
      }
    }
    if (leader() && failure.ok() && rejoin.ok()) {
      bool folded = false;
      if (ring_failure.ok() && window_error_feedback_ && onebit_->step() > o_.onebit_warmup_steps) {
        ExchangeStats fold;
        ring_failure = exchanger_->FoldResiduals(*onebit_, &fold);
        summary_.bytes_sent += fold.bytes_sent;
        summary_.bytes_received += fold.bytes_received;
        summary_.exchange_s += fold.seconds;
        summary_.fold_bytes_sent += fold.bytes_sent;
        folded = ring_failure.ok();
      } else if (ring_failure.ok()) {
        exchanger_->DropResiduals();
      }
      SyncStats stats;
      stats.inner_compute_seconds = compute_since_sync_s_;
      stats.inner_steps = steps_since_sync_;
      stats.exchange_seconds = summary_.exchange_s - before.exchange_s;
      stats.bytes_sent = summary_.bytes_sent - before.bytes_sent;
      stats.bytes_received = summary_.bytes_received - before.bytes_received;
      stats.wait_seconds = summary_.wait_s - before.wait_s;
      absl::StatusOr<Verdict> verdict;
      uint64_t hash = 0;
      if (ring_failure.ok()) {
        // The residuals are folded (or there are none): the hash covers them, zero on every member.
        std::vector<uint8_t> image = onebit_->Serialize(local_, exchanger_->MomentumResidual());
        hash = OneBitAdam::ImageHash(image);
        if (state_server_) state_server_->Publish({key, hash, image});
        verdict = exchanger_->ReportWindowDone(hash, stats);
        if (verdict.ok()) committed_image_ = std::move(image);
        if (folded) kind = kFullModel;
      } else {
        spdlog::warn("{}: window {} (steps {}..{}) failed at step {}: {}", o_.island_id, window, t + 1, end,
                     onebit_->step() + 1, fl::ToStd(ring_failure.message()));
        verdict = exchanger_->ReportWindowFailed(ring_failure, stats);
      }
      if (!verdict.ok()) {
        (IsRejoinNeeded(verdict.status()) ? rejoin : failure) = verdict.status();
      } else if (verdict->kind == VerdictKind::kRetry) {
        // Nobody applied the window: back to its start (the committed state, no residuals), on a new ring.
        if (absl::Status s = onebit_->Restore(committed_image_, local_); !s.ok()) return s;
        ++summary_.retries;
        next = t;
        kind = kFullModel;
        spdlog::info("{}: window {} rolled back to step {}; running it again on the coordinator's next ring",
                     o_.island_id, window, t);
      } else if (verdict->kind == VerdictKind::kRepair) {
        if (!verdict->source.has_value()) {
          failure = absl::InternalError("repair verdict without a source");
        } else {
          spdlog::warn("{}: window {} not applied here or hash {} differs from the majority's {}: copying the state",
                       o_.island_id, window, core::FingerprintToHex(hash),
                       core::FingerprintToHex(verdict->majority_hash));
          exchanger_->ResetRing();
          if (absl::Status s = LoadOneBitState(*verdict->source); !s.ok()) {
            failure = s;
          } else {
            next = (verdict->source->key.step + 1) * window_steps_;
            kind = kFullModel;
          }
        }
      } else {
        metrics_.Line(fl::StrCat("{\"event\":\"sync\",\"island\":\"", o_.island_id, "\",\"window\":", window,
                                 ",\"step\":", end, ",\"ring_size\":", ring_size,
                                 ",\"folded\":", folded ? "true" : "false", ",\"bytes_sent\":", stats.bytes_sent,
                                 ",\"compute_s\":", stats.inner_compute_seconds, ",\"hash\":\"",
                                 core::FingerprintToHex(hash), "\"}"));
        ++summary_.outer_steps;
      }
    }
    if (leader() && failure.ok() && !rejoin.ok()) {
      absl::StatusOr<SyncKey> k =
          RejoinWithState(rejoin, [this](const StateSource& source) { return LoadOneBitState(source); });
      if (!k.ok()) {
        failure = k.status();
      } else {
        next = (k->step + 1) * window_steps_;
        kind = kFullModel;
      }
    }
    if (leader() && !failure.ok()) kind = kStop;
    if (absl::Status s = ShareWindowControl(&kind, &next); !s.ok()) return s;
    if (kind == kStop)
      return leader() ? failure : absl::AbortedError("the island leader stopped after a failed window");
    if (!leader() && !ring_failure.ok() && kind != kFullModel) {
      return absl::InternalError("a failed window without the leader's state to roll back to");
    }
    if (kind == kFullModel) staging_->FromHost(local_);
    t = next;
  }
  summary_.wall_s = Since(start);
  staging_->ToHost(local_);
  summary_.local_model_hash = core::Checksum64(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(local_.data()), local_.size() * sizeof(float)));
  summary_.state_hash = onebit_->Hash(local_);
  if (leader()) {
    summary_.final_eval_loss = task_->EvalLoss();
    summary_.final_local_eval_loss = summary_.final_eval_loss;
    if (absl::Status s = client_->Leave("finished"); !s.ok()) {
      spdlog::warn("{}: leave: {}", o_.island_id, fl::ToStd(s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status IslandRun::LoadState(const StateSource& source) {
  const auto start = Clock::now();
  FetchOptions fetch;
  fetch.verify = [this](std::span<const uint8_t> image) -> absl::StatusOr<uint64_t> {
    absl::StatusOr<OuterState> copy = OuterState::Create(
        spec_, std::vector<float>(outer_->global().begin(), outer_->global().end()), outer_->options());
    if (!copy.ok()) return copy.status();
    if (absl::Status s = copy->Restore(image); !s.ok()) return s;
    return copy->Hash();
  };
  if (o_.secured()) {
    fetch.tls = ClientTls();
    fetch.peer_island = source.island_id;
  }
  absl::StatusOr<StateSnapshot> snap = FetchState(source.endpoint, source.expected_hash, fetch);
  if (!snap.ok()) return snap.status();
  if (absl::Status s = outer_->Restore(snap->image); !s.ok()) return s;
  if (outer_->Hash() != source.expected_hash) {
    return absl::DataLossError(fl::StrCat("state copied from ", source.island_id, " hashes to ",
                                          core::FingerprintToHex(outer_->Hash()), ", expected ",
                                          core::FingerprintToHex(source.expected_hash)));
  }
  if (absl::Status s = client_->ReportStateLoaded(source.key, outer_->Hash()); !s.ok()) return s;
  if (state_server_) state_server_->Publish({source.key, outer_->Hash(), outer_->Serialize()});
  spdlog::info("{} loaded the global state after sync ({}, {}) from {} ({:.2f} s, hash {})", o_.island_id,
               source.key.step, source.key.fragment, source.island_id, Since(start),
               core::FingerprintToHex(outer_->Hash()));
  return absl::OkStatus();
}

// The leader's admission by fl-coordinator (every mode that has one): its state server (peers copy the
// committed state from it), the client, and the Join with this island's model and sync mode.
absl::StatusOr<Assignment> IslandRun::ConnectToCoordinator() {
  std::string state_listen = o_.state_endpoint.empty() ? std::string("127.0.0.1:0") : o_.state_endpoint;
  // The state server serves mutual TLS with the island's own certificate (it has serverAuth too), so that only
  // islands of the same CA copy the global state.
  std::optional<rpc::ServerTls> state_tls;
  if (o_.secured()) {
    state_tls.emplace();
    state_tls->cert_file = o_.tls_cert;
    state_tls->key_file = o_.tls_key;
    state_tls->client_ca_file = o_.tls_ca;
  }
  absl::StatusOr<std::unique_ptr<StateServer>> server = StateServer::Start(state_listen, 2, state_tls);
  if (!server.ok()) return server.status();
  state_server_ = std::move(*server);
  CoordinatorClientOptions client_options;
  if (o_.secured()) client_options.tls = ClientTls();
  client_ = std::make_unique<CoordinatorClient>(client_options);
  IslandJoinRequest join;
  join.island_id = o_.island_id;
  join.data_endpoint = o_.advertised_endpoint.empty() ? o_.data_endpoint : o_.advertised_endpoint;
  // Peers fetch the state at the host the server listens on (--state-endpoint HOST:0 across machines);
  // a wildcard or no --state-endpoint names no host, so loopback as before.
  const std::string state_host = state_listen.substr(0, state_listen.rfind(':'));
  join.state_endpoint = state_host.empty() || state_host == "0.0.0.0" || state_host == "[::]"
                            ? state_server_->endpoint()
                            : fl::StrCat(state_host, ":", state_server_->port());
  join.num_ranks = static_cast<uint32_t>(o_.ranks);
  join.model_fingerprint = spec_->fingerprint();
  join.model_name = o_.model;
  join.software_version = "fl-island";
  join.device_class = device_.cuda ? "gpu" : "x86";
  join.accelerator = device_.cuda ? AcceleratorName(device_.index) : std::string();
  join.sync_mode = o_.mode;
  return client_->Connect(o_.coordinator, join);
}

absl::Status IslandRun::SetupLeader() {
  OuterOptions outer = o_.outer;
  ExchangeConfig c;
  c.self_id = o_.island_id;
  c.bind_endpoint = o_.data_endpoint;
  c.codec = o_.codec;
  c.sync_mode = o_.mode;
  c.error_feedback = o_.error_feedback;
  c.connections_per_peer = o_.connections_per_peer;
  c.timeout = absl::Seconds(o_.exchange_timeout_s);
  if (o_.secured()) c.curve_dir = o_.CurveDir();
  std::optional<StateSource> late_source;
  if (!o_.coordinator.empty()) {
    absl::StatusOr<Assignment> assignment = ConnectToCoordinator();
    if (!assignment.ok()) return assignment.status();
    // The coordinator's schedule is the one source of truth for everything all islands must agree on.
    const IslandSchedule& s = assignment->schedule;
    outer.inner_steps = s.inner_steps;
    outer.num_fragments = s.num_fragments;
    absl::StatusOr<core::FragmentStrategy> strategy = core::ParseFragmentStrategy(s.fragment_strategy);
    if (!strategy.ok()) return strategy.status();
    outer.strategy = *strategy;
    outer.overlap_steps = s.overlap_steps;
    outer.mixing_alpha = s.mixing_alpha;
    outer.outer_optimizer = s.outer_optimizer;
    TakeRingSettings(s, c);
    if (s.total_outer_steps > 0) total_steps_ = s.total_outer_steps * s.inner_steps;
    late_source = assignment->state_source;
  } else {
    for (const std::string& p : o_.peers) {
      const size_t eq = p.find('=');
      c.static_peers.push_back(RingMember{p.substr(0, eq), p.substr(eq + 1)});
    }
  }
  absl::StatusOr<OuterState> state = OuterState::Create(spec_, local_, outer);
  if (!state.ok()) return state.status();
  outer_.emplace(std::move(*state));
  spdlog::info("{}: {} parameters, H={} P={} tau={} alpha={} codec={}{}\n{}", o_.island_id, spec_->num_elements(),
               outer.inner_steps, outer.num_fragments, outer.overlap_steps, outer_->alpha(), c.codec,
               c.error_feedback ? "+ef" : "", outer_->plan().Describe());
  exchanger_ = std::make_unique<Exchanger>(std::move(c), client_.get());
  if (late_source.has_value()) {
    if (absl::Status s = LoadState(*late_source); !s.ok()) return s;
    first_step_ =
        outer_->schedule().SendStep(late_source->key.fragment, late_source->key.step) + outer_->options().overlap_steps;
    if (absl::Status s = outer_->CopyGlobalInto(local_); !s.ok()) return s;
    staging_->FromHost(local_);
    summary_.late_joined = true;
  }
  return absl::OkStatus();
}

absl::Status IslandRun::ApplyAt(uint64_t step, size_t fragment, uint64_t* resume_step) {
  *resume_step = step;
  torch::Tensor control = torch::zeros({3}, torch::kInt64);
  if (leader()) {
    const auto wait_start = Clock::now();
    ExchangeOutcome out = exchanger_->Wait();
    summary_.bytes_sent += out.bytes_sent;
    summary_.bytes_received += out.bytes_received;
    summary_.peak_sync_bytes = std::max(summary_.peak_sync_bytes, out.bytes_sent);
    summary_.exchange_s += out.exchange_seconds;
    summary_.retries += out.attempts > 0 ? out.attempts - 1 : 0;
    int64_t kind = kFragment;
    absl::Status failure;
    switch (out.kind) {
      case ExchangeOutcome::Kind::kAveraged: {
        if (absl::Status s = outer_->ApplyOuterStep(fragment, out.values); !s.ok()) return s;
        staging_->ToHost(local_);
        if (absl::Status s = outer_->MixInto(fragment, local_); !s.ok()) return s;
        const uint64_t hash = outer_->Hash();
        if (state_server_) state_server_->Publish({out.key, hash, outer_->Serialize()});
        SyncStats stats;
        stats.inner_compute_seconds = compute_since_sync_s_;
        stats.inner_steps = steps_since_sync_;
        stats.exchange_seconds = out.exchange_seconds;
        stats.bytes_sent = out.bytes_sent;
        stats.bytes_received = out.bytes_received;
        stats.wait_seconds = out.wait_seconds;
        absl::StatusOr<Verdict> verdict = exchanger_->Commit(out, hash, stats);
        if (!verdict.ok()) {
          if (!IsRejoinNeeded(verdict.status())) return verdict.status();
          out.kind = ExchangeOutcome::Kind::kRejoin;
        } else if (verdict->kind == VerdictKind::kRepair && verdict->source.has_value()) {
          spdlog::warn("{}: state hash {} disagrees with the majority's {} after sync ({}, {}): repairing",
                       o_.island_id, core::FingerprintToHex(hash), core::FingerprintToHex(verdict->majority_hash),
                       out.key.step, out.key.fragment);
          if (absl::Status s = LoadState(*verdict->source); !s.ok()) return s;
          if (absl::Status s = outer_->CopyGlobalInto(local_); !s.ok()) return s;
          kind = kFullModel;
        }
        ++summary_.syncs;
        metrics_.Line(fl::StrCat(
            "{\"event\":\"sync\",\"island\":\"", o_.island_id, "\",\"step\":", step, ",\"round\":", out.key.step,
            ",\"fragment\":", out.key.fragment, ",\"ring_size\":", out.ring_size, ",\"attempts\":", out.attempts,
            ",\"bytes_sent\":", out.bytes_sent, ",\"bytes_received\":", out.bytes_received,
            ",\"exchange_s\":", out.exchange_seconds, ",\"wait_s\":", out.wait_seconds,
            ",\"compute_s\":", compute_since_sync_s_, ",\"hash\":\"", core::FingerprintToHex(hash), "\"}"));
        compute_since_sync_s_ = 0;
        steps_since_sync_ = 0;
        break;
      }
      case ExchangeOutcome::Kind::kRepair:
        if (!out.source.has_value()) return absl::InternalError("repair verdict without a source");
        if (absl::Status s = LoadState(*out.source); !s.ok()) return s;
        if (absl::Status s = outer_->CopyGlobalInto(local_); !s.ok()) return s;
        kind = kFullModel;
        break;
      case ExchangeOutcome::Kind::kRejoin:
      case ExchangeOutcome::Kind::kFailed: break;
    }
    if (out.kind == ExchangeOutcome::Kind::kRejoin) {
      absl::StatusOr<SyncKey> rejoined =
          RejoinWithState(out.error, [this](const StateSource& source) { return LoadState(source); });
      if (!rejoined.ok()) {
        failure = rejoined.status();
      } else {
        const SyncKey k = *rejoined;
        *resume_step = outer_->schedule().SendStep(k.fragment, k.step) + outer_->options().overlap_steps;
        if (absl::Status s2 = outer_->CopyGlobalInto(local_); !s2.ok()) return s2;
        kind = kFullModel;
      }
    } else if (out.kind == ExchangeOutcome::Kind::kFailed) {
      failure = out.error;
    }
    if (!failure.ok()) kind = kStop;
    summary_.wait_s += Since(wait_start);
    control[0] = kind;
    control[1] = static_cast<int64_t>(*resume_step);
    staging_->FromHost(local_);  // the mixed fragment, or the whole copied model
    if (island_pg_) BroadcastHost(*island_pg_, control, torch_device_);
    if (!failure.ok()) return failure;
  } else {
    BroadcastHost(*island_pg_, control, torch_device_);
  }
  const int64_t kind = control[0].item<int64_t>();
  *resume_step = static_cast<uint64_t>(control[1].item<int64_t>());
  if (kind == kStop) return absl::AbortedError("the island leader stopped after a failed sync");
  if (!island_pg_) return absl::OkStatus();
  // Ranks: receive the leader's mixed fragment (or the whole model) into their replica.
  if (kind == kFragment) {
    const core::Fragment& frag = plan_->fragment(fragment);
    torch::Tensor values = torch::empty({static_cast<int64_t>(frag.num_elements)}, torch::kFloat32);
    if (leader()) {
      if (absl::Status s =
              plan_->Gather(fragment, local_, std::span<float>(values.data_ptr<float>(), frag.num_elements));
          !s.ok()) {
        return s;
      }
    }
    BroadcastHost(*island_pg_, values, torch_device_);
    if (!leader()) {
      staging_->ToHost(local_);
      if (absl::Status s =
              plan_->Scatter(fragment, std::span<const float>(values.data_ptr<float>(), frag.num_elements), local_);
          !s.ok()) {
        return s;
      }
      staging_->FromHost(local_);
    }
  } else {
    torch::Tensor values = torch::from_blob(local_.data(), {static_cast<int64_t>(local_.size())}, torch::kFloat32);
    BroadcastHost(*island_pg_, values, torch_device_);
    if (!leader()) staging_->FromHost(local_);
  }
  return absl::OkStatus();
}

absl::Status IslandRun::RunDiLoCo() {
  // The schedule every rank needs: the leader's (from the coordinator, or the flags) is broadcast.
  torch::Tensor sched = torch::zeros({6}, torch::kInt64);
  if (leader()) {
    if (absl::Status s = SetupLeader(); !s.ok()) return s;
    const OuterOptions& oo = outer_->options();
    sched[0] = static_cast<int64_t>(oo.inner_steps);
    sched[1] = static_cast<int64_t>(oo.num_fragments);
    sched[2] = static_cast<int64_t>(oo.overlap_steps);
    sched[3] = static_cast<int64_t>(total_steps_);
    sched[4] = static_cast<int64_t>(first_step_);
    sched[5] = static_cast<int64_t>(oo.strategy);
  }
  if (island_pg_) {
    BroadcastHost(*island_pg_, sched, torch_device_);
    torch::Tensor model = torch::from_blob(local_.data(), {static_cast<int64_t>(local_.size())}, torch::kFloat32);
    BroadcastHost(*island_pg_, model, torch_device_);
    if (!leader()) staging_->FromHost(local_);
  }
  absl::StatusOr<core::FragmentSchedule> schedule = core::FragmentSchedule::Create(
      static_cast<uint64_t>(sched[0].item<int64_t>()), static_cast<size_t>(sched[1].item<int64_t>()),
      static_cast<uint64_t>(sched[2].item<int64_t>()));
  if (!schedule.ok()) return schedule.status();
  schedule_.emplace(*schedule);
  absl::StatusOr<core::FragmentPlan> plan = core::FragmentPlan::Create(
      *spec_, schedule_->num_fragments(), static_cast<core::FragmentStrategy>(sched[5].item<int64_t>()));
  if (!plan.ok()) return plan.status();
  plan_.emplace(std::move(*plan));
  total_steps_ = static_cast<uint64_t>(sched[3].item<int64_t>());
  first_step_ = static_cast<uint64_t>(sched[4].item<int64_t>());
  summary_.first_step = first_step_;
  const uint64_t tau = schedule_->overlap_steps();
  const uint64_t h = schedule_->inner_steps_per_round();

  const auto start = Clock::now();
  uint64_t last_send = 0;  // the step of the exchange in flight (0 = none)
  uint64_t t = first_step_;
  while (t < total_steps_ || last_send != 0) {
    const bool training = t < total_steps_;
    if (training) {
      ++t;
      if (absl::Status s = InnerStep(t); !s.ok()) return s;
      if (std::optional<size_t> f = schedule_->FragmentSyncingAt(t); f.has_value()) {
        if (leader()) {
          std::vector<float> delta(plan_->fragment(*f).num_elements);
          staging_->ToHost(local_);
          if (absl::Status s = outer_->PseudoGradient(*f, local_, delta); !s.ok()) return s;
          const uint64_t round = (t - schedule_->SendStep(*f, 0)) / h;
          if (absl::Status s = exchanger_->Start(SyncKey{round, static_cast<uint32_t>(*f)}, std::move(delta));
              !s.ok()) {
            return s;
          }
        }
        last_send = t;
      }
    } else {
      t = last_send + tau;  // drain: the last exchange lands after the final inner step
    }
    if (last_send != 0 && t == last_send + tau) {
      const size_t fragment = *schedule_->FragmentSyncingAt(last_send);
      last_send = 0;
      uint64_t resume = t;
      if (absl::Status s = ApplyAt(t, fragment, &resume); !s.ok()) return s;
      if (resume != t) {
        spdlog::info("{}: continuing at step {} (was {})", o_.island_id, resume, t);
        t = resume;
      }
    }
    if (leader() && o_.eval_every > 0 && training && t % o_.eval_every == 0 && t < total_steps_) Eval(t);
  }
  summary_.wall_s = Since(start);
  staging_->ToHost(local_);
  summary_.local_model_hash = core::Checksum64(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(local_.data()), local_.size() * sizeof(float)));
  if (leader()) {
    summary_.final_local_eval_loss = task_->EvalLoss();
    staging_->FromHost(outer_->global());  // the model DiLoCo delivers is θ_global
    summary_.final_eval_loss = task_->EvalLoss();
    summary_.state_hash = outer_->Hash();
    summary_.outer_steps = outer_->total_outer_steps();
    if (client_) {
      if (absl::Status s = client_->Leave("finished"); !s.ok()) {
        spdlog::warn("{}: leave: {}", o_.island_id, fl::ToStd(s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<IslandSummary> IslandRun::Run() {
  if (absl::Status s = Setup(); !s.ok()) return s;
  absl::Status s = o_.mode == "data-parallel" ? RunDataParallel()
                   : o_.mode == "onebit-adam" ? RunOneBitAdam()
                                              : RunDiLoCo();
  if (!s.ok()) return s;
  if (leader()) {
    spdlog::info(
        "{} done: {} steps, eval loss {:.4f} (local {:.4f}), sent {} B, peak sync {} B, wall {:.1f} s, "
        "waited {:.2f} s",
        o_.island_id, summary_.steps, summary_.final_eval_loss, summary_.final_local_eval_loss, summary_.bytes_sent,
        summary_.peak_sync_bytes, summary_.wall_s, summary_.wait_s);
  }
  if (!o_.summary_path.empty()) {  // every rank: the ranks' local_model_hash must agree
    std::ofstream out(o_.summary_path);
    out << summary_.ToJson() << "\n";
    if (!out) return absl::InternalError(fl::StrCat("cannot write the summary to ", o_.summary_path));
  }
  return summary_;
}

}  // namespace

DeviceFacts ProbeDeviceFacts() {
  DeviceFacts facts;
  facts.cuda_devices = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
#ifdef USE_C10D_NCCL
  facts.nccl = true;
#endif
  return facts;
}

absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& requested, size_t slot, int cuda_device) {
  return ChooseDevice(requested, slot, cuda_device, ProbeDeviceFacts());
}

absl::StatusOr<IslandSummary> RunIsland(const IslandOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (absl::Status s = options.CheckTransportSecurity(); !s.ok()) return s;
  try {
    IslandRun run(options);
    return run.Run();
  } catch (const std::exception& e) {
    return absl::InternalError(fl::StrCat("island ", options.island_id, " rank ", options.rank, ": ", e.what()));
  }
}

}  // namespace fl::diloco

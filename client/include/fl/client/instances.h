// Virtual clients: one fl-client process hosting N client identities (`fl-client --instances N`).
//
// Each instance is a whole FederatedClient (its own session, clock offset, reconnects, error feedback, name and
// shard) with its own Trainer; what they share is the process: the LibTorch runtime, the model code, and a
// bounded number of trainings at a time (TrainGate), so that an added client costs its shard and its model state,
// not a process. Torch-free: fl-client's main wires the trainers.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/training/trainer.h"
#include "fl/core/mutex.h"

namespace fl::client {

// At most `limit` trainings or evaluations at a time across the instances of a process (the pool of training
// threads: more would only contend for the same cores and hold more activations in memory at once).
class TrainGate {
 public:
  explicit TrainGate(uint32_t limit) : limit_(limit == 0 ? 1 : limit) {}
  void Acquire();
  void Release();
  uint32_t limit() const { return limit_; }
  // The most that ever held the gate at once (tests check the bound with it).
  uint32_t peak() const;

 private:
  const uint32_t limit_;
  mutable fl::Mutex mu_;
  fl::CondVar cv_;
  uint32_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Trainer whose Train and Evaluate pass through a TrainGate, and whose exceptions (LibTorch throws c10::Error)
// become an Internal error naming the instance instead of ending the whole process with its other clients.
class GatedTrainer final : public training::Trainer {
 public:
  GatedTrainer(std::string instance, std::unique_ptr<training::Trainer> inner, TrainGate* gate)
      : instance_(std::move(instance)), inner_(std::move(inner)), gate_(gate) {}
  const core::ModelSpec& spec() const override { return inner_->spec(); }
  std::string model_name() const override { return inner_->model_name(); }
  std::string task() const override { return inner_->task(); }
  uint64_t num_train_examples() const override { return inner_->num_train_examples(); }
  uint64_t num_test_examples() const override { return inner_->num_test_examples(); }
  absl::Status GetParameters(std::span<float> out) override;
  absl::StatusOr<training::TrainResult> Train(std::span<const float> global,
                                              const training::TrainOptions& options) override;
  absl::StatusOr<training::EvalResult> Evaluate(std::span<const float> global) override;

 private:
  std::string instance_;
  std::unique_ptr<training::Trainer> inner_;
  TrainGate* gate_;
};

// The names of `count` instances named after `base`: base-<offset> .. base-<offset+count-1>, as fl-experiment names
// the clients of a group (`offset` > 0: a group split over several processes, clients[].instances_per_process).
std::vector<std::string> InstanceNames(const std::string& base, uint32_t count, uint32_t offset = 0);

// How many of `count` instances drop out of every secure round after sending their shares (fl-client
// --secagg-drop-after-shares FRACTION, a test hook for issue 29's dropout measurements): ceil(fraction x count),
// the instances with the lowest indices (NAME-0 ..), so that a run is repeatable. fraction in [0, 1].
uint32_t SecAggDroppingInstances(double fraction, uint32_t count);

// `--server` for N instances: one address for all, or N comma-separated addresses, one per instance (each its own
// emulated link, e.g. a shaping relay's port). InvalidArgument naming the counts otherwise.
absl::StatusOr<std::vector<std::string>> InstanceServers(const std::string& flag, uint32_t count);

// What N instances (or one client, EstimateOneClient) are expected to take, and what this machine has.
struct MemoryEstimate {
  uint64_t per_instance_bytes = 0;
  uint64_t count = 0;
  uint64_t total_bytes = 0;  // per_instance_bytes x count
  uint64_t limit_bytes = 0;  // what may be used: AvailableMemoryBytes(), or fl-client --memory-limit
  std::string how;           // how per_instance_bytes was found (measured / derived), for the log
  // One client (fl-client without --instances): the --model it names; CheckFits then says what one client can
  // do instead of how many instances fit. Empty for --instances.
  std::string model;
  std::string limit_source = "MemAvailable, or the cgroup's memory.max";  // where limit_bytes came from
  bool fits() const { return total_bytes <= limit_bytes; }
  std::string Describe() const;
};

// Peak activation bytes per example of a model's forward pass (evaluation) by its model_name(), from fl-client's
// peak RSS on amd64 at --eval-batch-size 100, 500 and 1000 and fitted so that the estimate covers the measured
// peak at 100 (docs/deploy-raspberry-pi.md "Memory"): cnn-fmnist 200 KiB, squeezenet1_1-fmnist 950 KiB; any other
// (a TorchScript model) 400 KiB, as measured for examples/bring-your-own-model's CnnBn (a guess for other
// architectures). 0 for synthetic-*.
uint64_t ActivationBytesPerExample(std::string_view model_name);

// What one fl-client needs at its peak, estimated once its trainer is built and before it joins:
struct OneClientMemory {
  std::string model;             // --model as given, for the message
  std::string model_name;        // the trainer's model_name()
  uint64_t resident_bytes = 0;   // ResidentBytes() with the trainer built: the runtime's libraries, the model and
                                 // its data shard (measured, not derived: the one figure that varies by build)
  uint64_t parameters = 0;       // the model's values
  uint32_t eval_batch_size = 0;  // --eval-batch-size
  uint32_t max_chunk_bytes = 0;  // --max-chunk-bytes
};
// What a client holds once it runs beyond its resident set at start and the parts below: gRPC's threads (about
// ten) with their stacks and malloc arenas, LibTorch's per-step allocations. Measured: the amd64 CNN client's
// resident set over 10 rounds (median 257-262 MiB) less its estimate without this term (242 MiB), rounded up.
// With it the estimates meet the measured peaks of docs/deploy-raspberry-pi.md "Memory" on amd64 within 1% for
// cnn, squeezenet and CnnBn (synthetic: 13% above).
inline constexpr uint64_t kRunningBytes = uint64_t{24} << 20;
// resident + kRunningBytes + training state (gradients and up to two optimizer moments: 3 x parameters x 4 bytes)
// + the larger of the evaluation batch's activations and a training batch's (32 examples, fl-server's default
// --batch-size, with autograd keeping about twice the forward's) + the session's buffers (SessionBytesPerInstance).
// Training and evaluation never overlap, so their activations are not added. The peak while loading the data
// (the whole IDX file before the shard is cut) has passed by then and is not part of it.
MemoryEstimate EstimateOneClient(const OneClientMemory& in, uint64_t limit_bytes);

// Session-side bytes of one instance besides its trainer, for a model of `num_parameters`: the downloaded model
// (encoded and decoded), the update being uploaded, its error-feedback residual, chunk buffers, the gRPC channel
// and the session's threads.
uint64_t SessionBytesPerInstance(uint64_t num_parameters, uint32_t max_chunk_bytes);

// Memory this process may still use: MemAvailable of /proc/meminfo, lowered to the cgroup's memory.max minus
// memory.current where a (v2) limit is set. 0 when neither can be read.
uint64_t AvailableMemoryBytes();
// This process's resident set now (/proc/self/statm), 0 when it cannot be read.
uint64_t ResidentBytes();

// OK when `e` fits; otherwise ResourceExhausted naming the count (or, for one client, the model), the estimate per
// instance and in all, the limit and what to do.
absl::Status CheckFits(const MemoryEstimate& e);

// The online window [start_s, end_s): end_s is infinity when the client stays online; start_s is infinity when it
// is never online again.
struct OnlineWindow {
  double start_s = 0;
  double end_s = 0;
};

// An availability trace (fl-client --availability trace:FILE, docs/testbed.md "Availability"): per client name, its
// online windows, sorted and disjoint. A client the trace does not name is always online.
struct AvailabilityTrace {
  std::string path;
  std::map<std::string, std::vector<OnlineWindow>, std::less<>> windows;
};

// Parses the trace format: one window per line, `<client name> <from_s> <until_s>` (seconds since the instances
// started; until_s may be `inf`), `#` starts a comment, blank lines are skipped. InvalidArgument naming
// `path:line` and what is wrong (a missing field, a number that is not one, from >= until, a negative time,
// windows of one client that overlap).
absl::StatusOr<AvailabilityTrace> ParseAvailabilityTrace(std::istream& in, const std::string& path);

// Client availability over time (fl-client --availability): either a seeded diurnal model
// (diurnal:period_s=P,online=F,seed=S: the instance with shard k is online for F x P seconds of every period P,
// starting at a phase drawn from (seed, k) alone, so the same flags give every run the same schedule) or a trace
// (trace:FILE). Times are seconds since the process started its instances.
struct Availability {
  double period_s = 0;  // 0: always online
  double online_fraction = 1;
  uint64_t seed = 0;
  std::shared_ptr<const AvailabilityTrace> trace;  // set: the trace decides, the diurnal fields are unused
  bool always() const { return trace == nullptr && (period_s <= 0 || online_fraction >= 1); }
};

// The largest availability trace read: a line per online window, about 30 bytes, so 64 MiB is two million windows
// (a thousand clients with two thousand windows each), far more than an experiment's schedule needs.
inline constexpr uint64_t kMaxAvailabilityTraceBytes = uint64_t{64} << 20;

// Parses "diurnal:period_s=P,online=F[,seed=S]" (P > 0, F in (0, 1]) or "trace:FILE" (read now: a regular file
// of at most kMaxAvailabilityTraceBytes, a FIFO or a device is refused before a byte is read); InvalidArgument
// naming the part, or the file and line.
absl::StatusOr<Availability> ParseAvailability(const std::string& spec);

// The online window that contains `t_s`, or else the next one, of the instance with shard `client_index` and name
// `client_name` (the trace's key).
OnlineWindow NextOnlineWindow(const Availability& a, uint32_t client_index, double t_s,
                              std::string_view client_name = {});

}  // namespace fl::client

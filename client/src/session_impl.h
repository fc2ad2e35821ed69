// FederatedClient::Impl: fl-client's session state and its members' declarations, private to fl_client and
// shared by the two files that define them: session.cc (join, the session stream, heartbeats, clock pings,
// reconnects, running tasks) and session_transfer.cc (the DownloadModel and UploadUpdate calls). The transfers
// have a file of their own because they are the byte-level half of a session (raw ByteBuffers, chunks received in
// place, XXH3 checks), read and changed apart from the session's protocol and threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/client/secure_update.h"
#include "fl/client/session.h"
#include "fl/client/uplink_encoder.h"
#include "fl/core/checksum.h"
#include "fl/core/clock.h"
#include "fl/core/mutex.h"
#include "fl/proto/chunk_reader.h"
#include "fl/proto/convert.h"
#include "fl/rpc/tls.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::client {

using fl::v1::ClientMessage;
using fl::v1::ServerMessage;

// Helpers of both files: a call's gRPC deadline (Join, Download, Upload); a phase's timing as the client reports
// it (the download's in Download; evaluation, training, idle and uplink in RunTask).
inline std::chrono::system_clock::time_point DeadlineAfterMs(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

inline fl::v1::PhaseTiming Phase(fl::v1::Phase phase, int64_t start_ns, int64_t end_ns, uint64_t bytes = 0) {
  fl::v1::PhaseTiming t;
  t.set_phase(phase);
  t.set_start_client_ns(start_ns);
  t.set_duration_ns(end_ns - start_ns);
  t.set_bytes(bytes);
  return t;
}

// A downloaded model; its values are in FederatedClient::Impl::global_ (reused from round to round).
struct Downloaded {
  uint64_t model_version = 0;
  uint64_t bytes = 0;
  fl::v1::PhaseTiming timing;
};

class FederatedClient::Impl {
 public:
  Impl(ClientOptions options, training::Trainer* trainer)
      : options_(std::move(options)),
        trainer_(trainer),
        secure_(SecureUpdate::Options{.drop_after_shares = options_.secagg_drop_after_shares}) {
    grpc::ChannelArguments args = proto::SessionChannelArguments();
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // A connection of its own even beside other sessions of this process (fl-client --instances): as separate
    // devices would, and so that one instance's reconnect or stalled stream is not every instance's.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    ApplySocketBinding(options_.binding, &args);
    if (options_.tls.has_value() && !options_.tls->server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls->server_name);
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = rpc::ChannelCredentials(options_.tls);
    if (!credentials.ok()) {
      // Reported by Run(): a constructor cannot fail, and retrying would not make the file readable.
      setup_error_ = credentials.status();
      credentials = grpc::InsecureChannelCredentials();
    }
    channel_ = grpc::CreateCustomChannel(options_.server_address, *credentials, args);
    stub_ = fl::v1::Federation::NewStub(channel_);
  }

  absl::Status Run();
  // This client's clock: the monotonic clock, shifted by the test skew.
  int64_t Now() const { return NowNs() + options_.clock_skew_ns; }
  void Stop() {
    stop_ = true;
    task_cancelled_ = true;
    {
      fl::MutexLock lock(ctx_mu_);
      if (session_ctx_ != nullptr) session_ctx_->TryCancel();
      if (join_ctx_ != nullptr) join_ctx_->TryCancel();
    }
    queue_cv_.NotifyAll();
    stop_cv_.NotifyAll();
    secure_.Wake();  // a worker waiting for a masking start looks at task_cancelled_
  }

 private:
  enum class SessionEnd { kFinished, kReconnect };

  absl::StatusOr<fl::v1::JoinResponse> Join(uint32_t timeout_ms);
  absl::Status UploadInitialModel();
  absl::StatusOr<SessionEnd> RunSession();
  void Worker();
  void RunTask(const fl::v1::Task& task);
  // The update of a train task with Task.secagg, masked where it lies in encoded_ (secure_update.h), the header's
  // secagg metrics added to `h`: true to upload it; false when there is nothing to send (the task was cancelled,
  // the session ended, the drop-after-shares test hook); an error to report as the task's failure.
  absl::StatusOr<bool> MaskUpdate(const fl::v1::Task& task, uint64_t num_examples, int64_t task_start,
                                  fl::v1::UpdateHeader* h);
  // Task.secagg arrived (the reader thread): opens the secure round and sends the keys at once.
  void StartSecureRound(const fl::v1::Task& task);
  absl::StatusOr<Downloaded> Download(const fl::v1::Task& task);
  // Streams `payload` in chunks that refer to it in place (proto::EncodeDataChunkInPlace): gRPC may hold it after
  // this returns, so the caller changes it only once it is the sole holder again.
  absl::StatusOr<fl::v1::UploadUpdateResponse> Upload(fl::v1::UpdateHeader header,
                                                      std::shared_ptr<const std::vector<uint8_t>> payload,
                                                      uint32_t deadline_ms);
  bool WriteToSession(const ClientMessage& msg);
  void ReportFailure(const std::string& task_id, const absl::Status& status);

  ClientOptions options_;
  training::Trainer* trainer_;
  absl::Status setup_error_;  // the TLS files could not be read (see the constructor)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<fl::v1::Federation::Stub> stub_;
  // Transfer state reused across tasks (no allocation per chunk or per transfer).
  proto::DataChunkReader download_chunks_;
  core::TransferChecksum download_checksum_;
  core::TransferChecksum upload_checksum_;
  std::atomic<bool> stop_{false};

  // Per join.
  std::string client_id_;
  std::string token_;
  // The retry-after-ms of the last Join refused RESOURCE_EXHAUSTED (a server shedding load or at its session
  // limit); the next attempt waits at least that long. 0: none. Read and written by Run's thread only.
  uint32_t server_retry_after_ms_ = 0;
  uint32_t heartbeat_ms_ = 5000;
  uint32_t server_max_chunk_ = 1u << 20;

  // Per session.
  fl::Mutex ctx_mu_;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(ctx_mu_) = nullptr;
  grpc::ClientContext* join_ctx_ ABSL_GUARDED_BY(ctx_mu_) = nullptr;
  fl::CondVar stop_cv_;  // wakes backoff sleeps on Stop()

  // Sleeps `ms` unless Stop() comes first.
  void SleepUnlessStopped(uint32_t ms) {
    // stop_ is atomic, but Stop() takes ctx_mu_ between setting it and notifying, so the wake-up is not lost.
    fl::MutexLock lock(ctx_mu_);
    stop_cv_.WaitFor(ctx_mu_, std::chrono::milliseconds(ms), [&] { return stop_.load(); });
  }
  fl::Mutex write_mu_;
  grpc::ClientReaderWriter<ClientMessage, ServerMessage>* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  uint64_t seq_ ABSL_GUARDED_BY(write_mu_) = 0;
  fl::Mutex queue_mu_;
  fl::CondVar queue_cv_;
  std::deque<fl::v1::Task> tasks_ ABSL_GUARDED_BY(queue_mu_);
  bool session_over_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::string current_task_ ABSL_GUARDED_BY(queue_mu_);
  std::atomic<bool> task_cancelled_{false};

  // Model-sized buffers reused from round to round: a fresh 100 MB allocation per round costs page faults
  // and munmap that, on a small device, take as long as the transfer itself.
  std::vector<uint8_t> download_bytes_;
  std::vector<float> global_;
  std::vector<float> update_;
  // The update's payload; shared with the slices of its upload until gRPC has sent them (see RunTask).
  std::shared_ptr<std::vector<uint8_t>> encoded_;

  // Error feedback of lossy uplink codecs: what they lost is added to the next update, also when the task's
  // codec changes between rounds (uplink_encoder.h).
  UplinkEncoder uplink_encoder_;

  // The secure round of the current train task: the reader thread answers its stages, the worker masks the
  // update with it (secure_update.h).
  SecureUpdate secure_;
};

}  // namespace fl::client

// StreamOutbox: the write side of one server bidi stream (callback API), usable from any thread.
//
// gRPC allows one outstanding write per stream; Send() queues messages and writes them one after the other
// from OnWriteDone, and Close() finishes the stream once the queue is written. The owner of a stream often
// outlives the reactor (it may still hold the outbox after the stream ended), so the reactor calls Detach()
// in OnDone and every later Send/Close is dropped. Used by fl-server's Session stream (service.cc) and the
// islands coordinator's (diloco/coord).
//
// The queue may be bounded (SetLimit): a peer that does not read its stream must not make the server buffer
// without end. When a message finds `max_queued` others waiting, the queue is dropped and the stream is
// finished at once with the overflow status (the message being written stays alive until gRPC is done with it).
#pragma once

#include <deque>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"

namespace fl::rpc {

template <class Request, class Response>
class StreamOutbox {
 public:
  explicit StreamOutbox(grpc::ServerBidiReactor<Request, Response>* stream) : stream_(stream) {}

  // At most `max_queued` messages wait (0: no bound); one more finishes the stream with `overflow_status`.
  void SetLimit(size_t max_queued, grpc::Status overflow_status) {
    fl::MutexLock lock(mu_);
    max_queued_ = max_queued;
    overflow_status_ = std::move(overflow_status);
  }

  enum class SendResult { kQueued, kDropped, kOverflowed };
  // kDropped: the stream has ended or is closing. kOverflowed: the queue was full, so the stream was finished
  // with the overflow status and its queue dropped.
  SendResult Send(Response message) {
    fl::MutexLock lock(mu_);
    if (stream_ == nullptr || closing_) return SendResult::kDropped;
    if (max_queued_ != 0 && outbox_.size() >= max_queued_) {
      closing_ = true;
      close_status_ = overflow_status_;
      // Keep the message gRPC is writing (it owns a pointer to it until OnWriteDone); drop the rest.
      if (writing_) {
        outbox_.erase(std::next(outbox_.begin()), outbox_.end());
      } else {
        outbox_.clear();
      }
      FinishLocked();  // not after the queue: a peer that does not read would never see the end
      return SendResult::kOverflowed;
    }
    outbox_.push_back(std::move(message));
    if (!writing_) WriteNextLocked();
    return SendResult::kQueued;
  }

  // Finishes the stream with `status` after the queued messages; later Sends are dropped.
  void Close(const grpc::Status& status) {
    fl::MutexLock lock(mu_);
    if (stream_ == nullptr || closing_) return;
    closing_ = true;
    close_status_ = status;
    if (!writing_) FinishLocked();
  }

  // Close() was called, the queue overflowed or the stream is gone: nothing more will be sent.
  bool closing() {
    fl::MutexLock lock(mu_);
    return closing_ || stream_ == nullptr;
  }

  // From the reactor's OnWriteDone.
  void OnWriteDone(bool ok) {
    fl::MutexLock lock(mu_);
    writing_ = false;
    if (!outbox_.empty()) outbox_.pop_front();
    if (!ok) outbox_.clear();  // the stream is broken: nothing more will get through
    if (stream_ == nullptr) return;
    if (!outbox_.empty()) {
      WriteNextLocked();
    } else if (closing_) {
      FinishLocked();
    }
  }

  // From the reactor's OnDone: the stream is gone.
  void Detach() {
    fl::MutexLock lock(mu_);
    stream_ = nullptr;
    outbox_.clear();
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    stream_->StartWrite(&outbox_.front());
  }
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    stream_->Finish(close_status_);
  }

  fl::Mutex mu_;
  grpc::ServerBidiReactor<Request, Response>* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<Response> outbox_ ABSL_GUARDED_BY(mu_);  // front() is being written while writing_
  size_t max_queued_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status overflow_status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fl::rpc

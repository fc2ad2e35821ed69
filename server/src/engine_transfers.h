// The round engine's upload slots (loop-owned, server/src only): how many uploads may stream at once
// (--upload-slots), the model-sized receive buffers kept for the next ones, and the watch over each upload that
// holds a slot, which takes the slot back from one that stalls or trickles (docs/round-engine.md, "Upload slots").
// It knows nothing of tasks or records: Judge says which uploads lose their slot and why; the core records it and
// revokes them.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/support/status.h>

#include "fl/server/events.h"

namespace fl::server::engine {

// What an upload holding a slot must keep up (EngineConfig upload_*; 0 turns a check off).
struct UploadLimits {
  uint32_t message_timeout_ms = 0;  // longest silence between two of its messages
  uint32_t min_bytes_per_s = 0;     // slowest rate, on average and over its most recent window
  uint32_t rate_grace_ms = 0;       // the average is judged only after this long
  uint64_t max_chunk_bytes = 0;     // a chunk's size: a slow link's window spans four of them
};

class UploadSlots {
 public:
  // The shortest window over which an upload's recent rate is judged: longer than the pauses an honest stream
  // shows between messages (a TCP retransmission timeout is 0.2-1 s on Linux, a radio handover well under a
  // second), short enough that a stream that stopped gives its slot back within a quarter of an 8 s round. An
  // upload whose own chunks take longer at its pace so far gets four of them.
  static constexpr int64_t kProgressWindowNs = 2'000'000'000;

  explicit UploadSlots(uint32_t slots) : slots_(slots) {}

  // Slots: one is free, taken by a granted upload, given back when its payload is consumed.
  bool HasFree() const { return busy_ < slots_; }
  void Take() { ++busy_; }
  void Give() {
    if (busy_ > 0) --busy_;
  }
  uint32_t busy() const { return busy_; }

  // Receive buffers: one kept per slot at most, so that an update costs no fresh model-sized allocation.
  std::vector<uint8_t> TakeBuffer();
  void ReturnBuffer(std::vector<uint8_t> buffer);
  void DropBuffers() { std::vector<std::vector<uint8_t>>().swap(free_buffers_); }
  size_t buffers() const { return free_buffers_.size(); }

  // Uploads waiting for a slot, first come first served: their headers were admitted, their `admit` not yet called.
  void Wait(UploadStartEvent upload) { waiting_.push_back(std::move(upload)); }
  bool HasWaiting() const { return !waiting_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  // The oldest waiting upload, out of the queue (requires HasWaiting()).
  UploadStartEvent NextWaiting() {
    UploadStartEvent next = std::move(waiting_.front());
    waiting_.pop_front();
    return next;
  }

  // The watch: an upload granted a slot at `granted_ns` (its header announced `payload_bytes`), until it ends.
  void Watch(std::shared_ptr<UploadHandle> handle, std::string client_id, std::string task_id, int64_t granted_ns,
             uint64_t payload_bytes);
  void Unwatch(const UploadHandle* handle);
  bool watching() const { return !active_.empty(); }
  // The server itself stalled for `stall_ns`: neither a silence of the uploads nor time at a low rate.
  void MoveOn(int64_t stall_ns);

  struct Revocation {
    std::shared_ptr<UploadHandle> handle;
    std::string client_id;
    std::string task_id;
    grpc::Status status;  // what the client is told (RATE_LIMITED, naming the limit)
  };
  // The uploads that lose their slot at `now` (silent past the message timeout, too slow on average, or stalled
  // over their most recent window), each once: the caller revokes them.
  std::vector<Revocation> Judge(int64_t now, const UploadLimits& limits);

 private:
  struct Active {
    std::shared_ptr<UploadHandle> handle;
    std::string client_id;
    std::string task_id;
    int64_t granted_ns = 0;
    uint64_t payload_bytes = 0;
    // Its last message as the engine counts it: the reactor's stamp, moved on by the server's own stalls.
    int64_t last_progress_ns = 0;
    // (when the engine saw it, payload bytes) at each check where the count had changed, oldest first.
    std::deque<std::pair<int64_t, uint64_t>> progress;
    bool revoked = false;
  };
  uint32_t slots_;
  uint32_t busy_ = 0;
  std::deque<UploadStartEvent> waiting_;
  std::vector<std::vector<uint8_t>> free_buffers_;
  std::vector<Active> active_;
};

}  // namespace fl::server::engine

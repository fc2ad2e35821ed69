// RingAllReduce over ZeroMQ: see ring_allreduce.h for the algorithm, the wire format and the guarantees.
//
// Why one file of this size: the transport (sockets, hellos, monitors), the one schedule shared by the two
// payload paths and the abort/timeout handling all read and write the same per-exchange state; split, every
// part would need that state in a header of its own and the schedule would be read across files.
//
// Transport. Every member binds one PULL socket on its endpoint and connects `connections_per_peer` PUSH
// sockets to its successor's. PUSH/PULL fits a ring: traffic flows one way, each PUSH socket is exactly one
// TCP connection to one known peer, and a PULL socket fair-queues whatever its connections deliver. The
// first message on every connection is a hello naming the sender, so that the receiver can tell which TCP
// connections (file descriptors, read with ZMQ_SRCFD) belong to its predecessor; a socket monitor then
// reports their disconnection at once, which is how a vanished peer is noticed before any timeout. The
// send high-water marks are unlimited: one exchange queues at most the member's share of the vector, and a
// bounded queue could deadlock the ring (every member sending its first chunk before receiving).
//
// Messages are sent without copying (the encoded payload's buffer is handed to ZeroMQ with a free
// function) and forwarded without copying (zmq_msg_copy shares the received buffer). With several
// connections per peer the messages of one step may arrive out of order, so messages of the current
// exchange that come early wait in a map until they are needed.
//
// Codec "fp32" takes a faster path (RunRingRaw): the payload is the floats themselves, sent zero-copy
// straight from the caller's input (reduce-scatter step 0) or from the result being built (partial sums,
// the owner's final chunk); the receiver adds (and divides) with a NaN/Inf check fused into the same loop
// (ring_kernels.h). Per member and exchange that leaves one pass over each received value and nothing on
// the sending side but the kernel's copy. Because ZeroMQ then reads memory the caller owns, AllReduce
// waits before it returns until ZeroMQ has released every such buffer (ZeroCopyTracker); if the successor
// stops reading, the push sockets are closed with linger 0 (which releases them) and reconnected.
#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "fl/diloco/net/ring_allreduce.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <zmq.hpp>

#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
#endif

#include "fl/core/allocator.h"
#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_wire.h"
#include "ring_curve.h"
#include "ring_kernels.h"

namespace fl::diloco {
namespace {

using wire::Header;
using wire::MessageType;
using wire::PayloadKind;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

size_t NumSubChunks(size_t count, size_t sub_values) { return count == 0 ? 1 : (count + sub_values - 1) / sub_values; }

ValueRange SubRange(const ValueRange& chunk, size_t sub, size_t sub_values) {
  const size_t begin = std::min(chunk.end, chunk.begin + sub * sub_values);
  return {begin, std::min(chunk.end, begin + sub_values)};
}

size_t Mod(int64_t a, size_t m) {
  const int64_t r = a % static_cast<int64_t>(m);
  return static_cast<size_t>(r < 0 ? r + static_cast<int64_t>(m) : r);
}

// Send buffers are recycled: ZeroMQ's I/O thread returns each one when it has written it, and the next
// encode reuses it, so that a 4 MiB message costs neither an allocation nor fresh (page-faulting, zeroed)
// memory. Shared with the messages in flight, which may outlive the exchange (not the context, which
// waits for them).
class BufferPool {
 public:
  using Buffer = std::unique_ptr<std::vector<uint8_t>>;
  Buffer Acquire() {
    fl::MutexLock lock(mu_);
    if (free_.empty()) return std::make_unique<std::vector<uint8_t>>();
    Buffer b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void Release(Buffer b) {
    fl::MutexLock lock(mu_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(b));
  }

 private:
  static constexpr size_t kMaxFree = 64;
  fl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
};

struct InFlight {
  BufferPool::Buffer buffer;
  std::shared_ptr<BufferPool> pool;
};

// The InFlight made on the sending thread reaches ReleaseBuffer on ZeroMQ's I/O thread through libzmq's
// lock-free pipe, whose atomics ThreadSanitizer cannot see (Debian's libzmq is not instrumented). These tell it
// about that hand-off (release where the message is made, acquire where ZeroMQ gives it back), so the tsan
// preset checks the callback instead of reporting it or needing a suppression; without TSan they are nothing.
void HandOff([[maybe_unused]] void* p) {
#ifdef __SANITIZE_THREAD__
  __tsan_release(p);
#endif
}
void TakeOver([[maybe_unused]] void* p) {
#ifdef __SANITIZE_THREAD__
  __tsan_acquire(p);
#endif
}

void ReleaseBuffer(void* /*data*/, void* hint) {
  TakeOver(hint);
  auto* in_flight = static_cast<InFlight*>(hint);
  in_flight->pool->Release(std::move(in_flight->buffer));
  delete in_flight;
}

// Counts zero-copy messages that point into memory this exchange does not own beyond its return (the
// caller's input and output, the scratch result): ZeroMQ's I/O thread calls Done when it has written one.
class ZeroCopyTracker {
 public:
  void Add() {
    fl::MutexLock lock(mu_);
    ++pending_;
  }
  void Done() {
    fl::MutexLock lock(mu_);
    if (--pending_ == 0) cv_.NotifyAll();
  }
  // True when nothing is pending (at once or within `limit`).
  bool WaitFor(std::chrono::nanoseconds limit) {
    fl::MutexLock lock(mu_);
    return cv_.WaitFor(mu_, limit, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
  }
  void Wait() {
    fl::MutexLock lock(mu_);
    cv_.Wait(mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
  }

 private:
  fl::Mutex mu_;
  fl::CondVar cv_;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
};

void ZeroCopyDone(void* /*data*/, void* hint) { static_cast<ZeroCopyTracker*>(hint)->Done(); }

// Payload bytes of a message of `count` values: raw floats for codec fp32, the codec payload otherwise.
size_t PayloadBytes(const fl::core::Codec& codec, size_t count) {
  return codec.kind() == fl::core::CodecKind::kFp32 ? count * sizeof(float) : codec.EncodedSize(count);
}

// A received data message: its header and its payload frame (owned by ZeroMQ, shareable for forwarding).
struct Message {
  Header header;
  zmq::message_t payload;
  uint64_t frame_bytes = 0;
};

using MessageKey = std::tuple<uint8_t, uint32_t, uint32_t, uint32_t>;  // type, step, chunk, sub
MessageKey KeyOf(const Header& h) { return {static_cast<uint8_t>(h.type), h.step, h.chunk, h.sub}; }

}  // namespace

uint64_t RingFingerprint(const std::vector<RingMember>& members) {
  std::string text;
  for (const RingMember& m : members) {
    text += m.id;
    text.push_back('\0');
    text += m.endpoint;
    text.push_back('\0');
  }
  return fl::core::Checksum64(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
                              0x52494e47);
}

bool TuneAllocatorForLargeMessages() { return fl::core::KeepFreedMemory().ok(); }

ValueRange RingChunk(size_t num_values, size_t num_members, size_t chunk) {
  // 128-bit products: num_values * (chunk + 1) can exceed 64 bits only for absurd sizes, but be exact.
  const auto bound = [&](size_t c) {
    return static_cast<size_t>(static_cast<unsigned __int128>(num_values) * c / num_members);
  };
  return {bound(chunk), bound(chunk + 1)};
}

absl::StatusOr<uint64_t> RingBytesSentPerMember(size_t num_values, size_t num_members, size_t self,
                                                const std::string& codec_spec, size_t sub_chunk_values) {
  if (num_members == 0 || self >= num_members || sub_chunk_values == 0) {
    return absl::InvalidArgumentError(fl::StrCat("RingBytesSentPerMember: need self < num_members (got ", self, ", ",
                                                 num_members, ") and sub_chunk_values >= 1"));
  }
  auto codec = fl::core::MakeCodec(codec_spec);
  if (!codec.ok()) return codec.status();
  const size_t m = num_members;
  const auto chunk_bytes = [&](size_t chunk) {
    const ValueRange range = RingChunk(num_values, m, chunk);
    uint64_t bytes = 0;
    const size_t subs = NumSubChunks(range.size(), sub_chunk_values);
    for (size_t j = 0; j < subs; ++j) {
      bytes += wire::kHeaderBytes + PayloadBytes(**codec, SubRange(range, j, sub_chunk_values).size());
    }
    return bytes;
  };
  uint64_t total = 0;
  if (m == 1) return total;
  // Reduce-scatter: chunks self, self-1, ..., self-(M-2). All-gather: the owned chunk self+1, then the
  // forwarded chunks self, self-1, ..., self-(M-3).
  for (size_t s = 0; s + 1 < m; ++s) total += chunk_bytes(Mod(static_cast<int64_t>(self) - s, m));
  total += chunk_bytes((self + 1) % m);
  for (size_t s = 0; s + 2 < m; ++s) total += chunk_bytes(Mod(static_cast<int64_t>(self) - s, m));
  return total;
}

class RingAllReduce::Impl {
 public:
  explicit Impl(RingOptions options) : options_(std::move(options)) {}

  ~Impl() {
    const int linger_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.linger));
    // Stop the monitors before closing what they watch.
    if (pull_) zmq_socket_monitor(pull_.handle(), nullptr, 0);
    for (auto& push : push_) zmq_socket_monitor(push.handle(), nullptr, 0);
    for (auto& mon : monitors_) mon.close();
    if (pull_) {
      pull_.set(zmq::sockopt::linger, 0);
      pull_.close();
    }
    for (auto& push : push_) {
      push.set(zmq::sockopt::linger, linger_ms);
      push.close();
    }
    // context_'s destructor waits (at most the linger) for queued messages to reach live peers.
  }

  absl::Status Init() {
    const size_t m = options_.members.size();
    self_ = options_.self;
    succ_ = (self_ + 1) % m;
    pred_ = (self_ + m - 1) % m;
    fingerprint_ = RingFingerprint(options_.members);
    auto codec = fl::core::MakeCodec(options_.codec);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          fl::StrCat("RingOptions.codec '", options_.codec, "': ", fl::ToStd(codec.status().message())));
    }
    codec_ = std::move(*codec);
    lossy_ = codec_->kind() != fl::core::CodecKind::kFp32;
    raw_ = !lossy_;

    // One I/O thread for the incoming connection(s) and one per outgoing connection (up to 4), so that
    // receiving and sending are copied through the kernel in parallel where there are cores for it.
    context_.set(zmq::ctxopt::io_threads, std::min(1 + options_.connections_per_peer, 4));
    const std::string& bind_to =
        options_.bind_endpoint.empty() ? options_.members[self_].endpoint : options_.bind_endpoint;
    if (options_.curve.has_value()) {
      // Before the bind: without a ZAP handler libzmq would admit any CURVE client.
      auto zap = ZapAuthenticator::Start(
          context_, std::set<std::string>(options_.curve->public_keys.begin(), options_.curve->public_keys.end()));
      if (!zap.ok()) return zap.status();
      zap_ = std::move(*zap);
    }
    try {
      pull_ = zmq::socket_t(context_, zmq::socket_type::pull);
      pull_.set(zmq::sockopt::rcvhwm, 0);
      pull_.set(zmq::sockopt::linger, 0);
      if (options_.curve.has_value()) {
        pull_.set(zmq::sockopt::curve_server, 1);
        pull_.set(zmq::sockopt::curve_secretkey, options_.curve->secret_key);
      }
      AddMonitor(pull_, "pull");
      pull_.bind(bind_to);
      bound_endpoint_ = pull_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(fl::StrCat("ring member '", options_.members[self_].id, "' cannot bind ", bind_to,
                                               ": ", e.what(), " (is another process or ring still using it?)"));
    }
    if (m == 1) return absl::OkStatus();
    return ConnectPushSockets();
  }

  // In place: the result is built in scratch_ and copied into `values` only once the exchange succeeded.
  absl::Status AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<float> values, ReduceOp op,
                         ExchangeStats* stats_out) {
    scratch_.resize(values.size());  // kept across exchanges: no fresh (page-faulting) memory per call
    const bool identity = M() == 1 && !lossy_;
    absl::Status status =
        Run(exchange_id, residual_key, values, identity ? values : std::span<float>(scratch_), op, stats_out);
    if (status.ok() && !identity) {
      const Clock::time_point t0 = Clock::now();
      std::copy(scratch_.begin(), scratch_.end(), values.begin());
      if (stats_out != nullptr) stats_out->seconds += SecondsSince(t0);
    }
    return status;
  }

  absl::Status AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<const float> in, std::span<float> out,
                         ReduceOp op, ExchangeStats* stats_out) {
    if (in.size() != out.size()) {
      return absl::InvalidArgumentError(fl::StrCat("ring AllReduce: in has ", in.size(), " values but out has ",
                                                   out.size(), "; they must be the same size"));
    }
    if (!in.empty() && in.data() == out.data()) {
      return AllReduce(exchange_id, residual_key, out, op, stats_out);
    }
    if (!in.empty() && in.data() < out.data() + out.size() && out.data() < in.data() + in.size()) {
      return absl::InvalidArgumentError(
          "ring AllReduce: in and out overlap without being the same span; pass one span for in place");
    }
    return Run(exchange_id, residual_key, in, out, op, stats_out);
  }

  // Reduces `in` into `out` (distinct memory, or the same span for a ring of one with fp32). `in` is never
  // written; `out` is written only by this call and holds the result when it returns OK.
  absl::Status Run(uint64_t exchange_id, uint64_t residual_key, std::span<const float> in, std::span<float> out,
                   ReduceOp op, ExchangeStats* stats_out) {
    if (!reconnect_error_.ok()) return reconnect_error_;
    if (has_last_exchange_ && exchange_id <= last_exchange_id_) {
      return absl::InvalidArgumentError(
          fl::StrCat("ring exchange_id ", exchange_id, " is not larger than the previous one (", last_exchange_id_,
                     "): exchange ids must increase so that late messages of earlier exchanges can be told apart"));
    }
    has_last_exchange_ = true;
    last_exchange_id_ = exchange_id;
    exchange_id_ = exchange_id;
    const Clock::time_point start = Clock::now();
    deadline_ = start + absl::ToChronoNanoseconds(options_.timeout);
    stats_ = ExchangeStats{};
    early_.clear();
    n_ = in.size();
    // Messages kept for this exchange (or older ones, now stale) leave the future stash.
    for (auto it = future_.begin(); it != future_.end() && it->first <= exchange_id;) {
      if (it->first == exchange_id) {
        for (Message& msg : it->second) {
          if (absl::Status s = Accept(std::move(msg)); !s.ok()) return Fail(s, pred_);
        }
      } else {
        stats_.stale_discarded += it->second.size();
      }
      it = future_.erase(it);
    }

    const bool feedback = options_.error_feedback && lossy_;
    std::vector<float> residual;
    if (feedback) {
      auto it = residuals_.find(residual_key);
      if (it != residuals_.end() && it->second.size() != n_) {
        return absl::InvalidArgumentError(fl::StrCat("ring residual_key ", residual_key, " holds a residual of ",
                                                     it->second.size(), " values but this exchange has ", n_,
                                                     ": call ResetResidual(", residual_key,
                                                     ") when a fragment's size changes"));
      }
      residual = it != residuals_.end() ? it->second : std::vector<float>(n_, 0.0f);
    }
    residual_ = feedback ? std::span<float>(residual) : std::span<float>();
    op_ = op;
    input_ = in;
    result_ = out;

    if (M() > 1 || lossy_) {
      absl::Status status = M() == 1 ? RunSingle() : raw_ ? RunRingRaw() : RunRing();
      // Whatever happened, ZeroMQ must be done with `in`, `out` and the scratch before the caller gets them
      // back (they may change or be freed right after).
      ReleaseZeroCopy(status.ok());
      if (!status.ok()) return status;
    } else if (in.data() != out.data()) {  // a ring of one with fp32 is the identity
      std::copy(in.begin(), in.end(), out.begin());
    }
    if (feedback) residuals_[residual_key] = std::move(residual);
    stats_.seconds = SecondsSince(start);
    if (stats_out != nullptr) *stats_out = stats_;
    return absl::OkStatus();
  }

  void ResetResidual(uint64_t key) { residuals_.erase(key); }
  std::span<const float> Residual(uint64_t key) const {
    auto it = residuals_.find(key);
    return it == residuals_.end() ? std::span<const float>() : std::span<const float>(it->second);
  }
  absl::Status SetCodec(const std::string& spec) {
    auto codec = fl::core::MakeCodec(spec);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(fl::StrCat("ring codec '", spec, "': ", fl::ToStd(codec.status().message())));
    }
    codec_ = std::move(*codec);
    options_.codec = spec;
    lossy_ = codec_->kind() != fl::core::CodecKind::kFp32;
    raw_ = !lossy_;
    return absl::OkStatus();
  }
  const RingOptions& options() const { return options_; }
  const std::string& bound_endpoint() const { return bound_endpoint_; }

 private:
  size_t M() const { return options_.members.size(); }
  size_t sub_values() const { return options_.sub_chunk_values; }
  std::string Name(size_t member) const {
    return fl::StrCat("'", options_.members[member].id, "' (", options_.members[member].endpoint, ")");
  }
  ValueRange Chunk(size_t chunk) const { return RingChunk(n_, M(), chunk); }

  // Connects the push sockets to the successor and sends the hello first on each (see the file comment).
  absl::Status ConnectPushSockets() {
    try {
      for (int k = 0; k < options_.connections_per_peer; ++k) {
        zmq::socket_t push(context_, zmq::socket_type::push);
        push.set(zmq::sockopt::sndhwm, 0);
        push.set(zmq::sockopt::linger, 0);
        if (options_.curve.has_value()) {
          push.set(zmq::sockopt::curve_serverkey, options_.curve->public_keys[succ_]);
          push.set(zmq::sockopt::curve_publickey, options_.curve->public_keys[self_]);
          push.set(zmq::sockopt::curve_secretkey, options_.curve->secret_key);
        }
        AddMonitor(push, fl::StrCat("push", k, "-", push_generation_));
        push.connect(options_.members[succ_].endpoint);
        push_.push_back(std::move(push));
      }
    } catch (const zmq::error_t& e) {
      return absl::InvalidArgumentError(fl::StrCat("ring member '", options_.members[self_].id, "' cannot connect to '",
                                                   options_.members[succ_].id, "' at ",
                                                   options_.members[succ_].endpoint, ": ", e.what()));
    }
    for (auto& push : push_) {
      Header hello;
      hello.type = MessageType::kHello;
      hello.ring = fingerprint_;
      hello.sender = static_cast<uint32_t>(self_);
      // The hello carries this member's sync mode, so that a successor running another one refuses it by name.
      absl::Status s = SendOn(push, hello, std::vector<uint8_t>(options_.sync_mode.begin(), options_.sync_mode.end()));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Waits until ZeroMQ has released every zero-copy message of this exchange. A successor that reads
  // normally has taken everything long before (it needed those bytes); one that has stopped reading (gone,
  // frozen) would keep them queued forever, so after a while the push sockets are closed with linger 0,
  // which drops (and releases) what they hold, and connected afresh. The successor may then see this
  // member's old connections close: at worst it fails one exchange, which it would have failed anyway.
  void ReleaseZeroCopy(bool succeeded) {
    const std::chrono::nanoseconds limit =
        succeeded ? absl::ToChronoNanoseconds(options_.timeout) : std::chrono::seconds(1);
    if (zero_copy_.WaitFor(limit)) return;
    for (size_t k = 0; k < push_.size(); ++k) {
      zmq_socket_monitor(push_[k].handle(), nullptr, 0);
      monitors_[1 + k].close();
      push_[k].set(zmq::sockopt::linger, 0);
      push_[k].close();
    }
    monitors_.resize(1);
    push_.clear();
    zero_copy_.Wait();  // closing with linger 0 makes the I/O threads drop, and so release, every message
    ++push_generation_;
    reconnect_error_ = ConnectPushSockets();
  }

  void AddMonitor(zmq::socket_t& socket, const std::string& what) {
    const std::string address = fl::StrCat("inproc://fl-ring-monitor-", reinterpret_cast<uintptr_t>(this), "-", what);
    // With CURVE, a handshake refused by the successor's authenticator is reported too (HANDSHAKE_FAILED_AUTH).
    const int events = ZMQ_EVENT_DISCONNECTED | (options_.curve.has_value() ? ZMQ_EVENT_HANDSHAKE_FAILED_AUTH : 0);
    if (zmq_socket_monitor(socket.handle(), address.c_str(), events) != 0) {
      throw zmq::error_t();
    }
    zmq::socket_t monitor(context_, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(address);
    monitors_.push_back(std::move(monitor));
  }

  // ---- Single member: values <- decode(encode(values)) so that a ring of one behaves like any other.
  absl::Status RunSingle() {
    std::copy(input_.begin(), input_.end(), result_.begin());
    const ValueRange all{0, n_};
    for (size_t j = 0; j < NumSubChunks(all.size(), sub_values()); ++j) {
      const ValueRange r = SubRange(all, j, sub_values());
      auto payload = EncodeFinal(r);
      if (!payload.ok()) return payload.status();
      if (absl::Status s = DecodeInto(**payload, r); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // ---- The ring's schedule, written once for both payload paths: reduce-scatter then all-gather,
  // sub-chunk by sub-chunk. `send_own(c, j, r)` sends sub-chunk j of this member's own chunk (reduce-scatter
  // step 0); `reduce(s, c, j, r, last, msg)` handles a received partial sum of step s (add own values, then
  // send it on, or, when `last`, complete the owned chunk and start its all-gather); `gather(c, j, r, msg)`
  // takes a received final sub-chunk, after the schedule has forwarded its bytes unchanged (no re-encoding,
  // no copy: the buffer is shared) unless the successor owns the chunk. Each returns the failure to report
  // (already passed through Fail) or OK.
  template <typename SendOwn, typename Reduce, typename Gather>
  absl::Status RunSchedule(SendOwn send_own, Reduce reduce, Gather gather) {
    const size_t m = M();
    const auto self = static_cast<int64_t>(self_);
    const ValueRange own = Chunk(self_);
    for (size_t j = 0; j < NumSubChunks(own.size(), sub_values()); ++j) {
      if (absl::Status s = send_own(self_, j, SubRange(own, j, sub_values())); !s.ok()) return s;
    }
    // Reduce-scatter steps: receive step s (chunk self-s-1), add own values, send it on as step s+1; the
    // last step completes the owned chunk self+1, which goes straight into the all-gather.
    for (size_t s = 0; s + 1 < m; ++s) {
      const size_t c = Mod(self - static_cast<int64_t>(s) - 1, m);
      const ValueRange chunk = Chunk(c);
      for (size_t j = 0; j < NumSubChunks(chunk.size(), sub_values()); ++j) {
        const ValueRange r = SubRange(chunk, j, sub_values());
        auto msg = Receive(MessageType::kReduceScatter, s, c, j, r, /*sends_left=*/true);
        if (!msg.ok()) return Fail(msg.status(), pred_);
        if (absl::Status st = reduce(s, c, j, r, /*last=*/s + 2 == m, *msg); !st.ok()) return st;
      }
    }
    // All-gather: receive step s (chunk self-s, owned by self-s-1), forward the same bytes unless the
    // successor owns the chunk, then take the values.
    for (size_t s = 0; s + 1 < m; ++s) {
      const size_t c = Mod(self - static_cast<int64_t>(s), m);
      const ValueRange chunk = Chunk(c);
      const bool forward = s + 2 < m;
      for (size_t j = 0; j < NumSubChunks(chunk.size(), sub_values()); ++j) {
        const ValueRange r = SubRange(chunk, j, sub_values());
        auto msg = Receive(MessageType::kAllGather, s, c, j, r, /*sends_left=*/forward);
        if (!msg.ok()) return Fail(msg.status(), pred_);
        if (forward) {
          zmq::message_t copy;
          copy.copy(msg->payload);  // shares the buffer (reference counted), no byte copy
          if (absl::Status st = SendFrames(MessageType::kAllGather, s + 1, c, j, r, std::move(copy)); !st.ok()) {
            return Fail(st, succ_);
          }
        }
        if (absl::Status st = gather(c, j, r, *msg); !st.ok()) return st;
      }
    }
    return absl::OkStatus();
  }

  // Any codec: every hop encodes what it sends; the owner encodes its final chunk once.
  absl::Status RunRing() {
    auto send_own = [&](size_t c, size_t j, const ValueRange& r) -> absl::Status {
      auto payload = EncodePartial(r, /*from_input=*/true);
      if (!payload.ok()) return Fail(payload.status(), self_);
      if (absl::Status s = Send(MessageType::kReduceScatter, 0, c, j, r, std::move(*payload)); !s.ok()) {
        return Fail(s, succ_);
      }
      return absl::OkStatus();
    };
    auto reduce = [&](size_t s, size_t c, size_t j, const ValueRange& r, bool last, Message& msg) -> absl::Status {
      const Clock::time_point t0 = Clock::now();
      std::span<float> dst(result_.data() + r.begin, r.size());
      std::copy(input_.begin() + r.begin, input_.begin() + r.end, dst.begin());
      // work = own + received: the same float additions as the fold (a + b == b + a exactly).
      if (absl::Status st = codec_->DecodeAccumulate(PayloadOf(msg.payload), 1.0f, dst); !st.ok()) {
        return Fail(PayloadError(st, msg), pred_);
      }
      stats_.decode_seconds += SecondsSince(t0);
      if (!last) {
        auto payload = EncodePartial(r, /*from_input=*/false);
        if (!payload.ok()) return Fail(payload.status(), self_);
        if (absl::Status st = Send(MessageType::kReduceScatter, s + 1, c, j, r, std::move(*payload)); !st.ok()) {
          return Fail(st, succ_);
        }
        return absl::OkStatus();
      }
      auto payload = EncodeFinal(r);
      if (!payload.ok()) return Fail(payload.status(), self_);
      // The owner's copy comes from the very bytes it sends, so that it matches every other member.
      if (lossy_) {
        if (absl::Status st = DecodeInto(**payload, r); !st.ok()) return Fail(st, self_);
      }
      if (absl::Status st = Send(MessageType::kAllGather, 0, c, j, r, std::move(*payload)); !st.ok()) {
        return Fail(st, succ_);
      }
      return absl::OkStatus();
    };
    auto gather = [&](size_t /*c*/, size_t /*j*/, const ValueRange& r, Message& msg) -> absl::Status {
      const Clock::time_point t0 = Clock::now();
      if (absl::Status st = codec_->Decode(PayloadOf(msg.payload), {result_.data() + r.begin, r.size()}); !st.ok()) {
        return Fail(PayloadError(st, msg), pred_);
      }
      stats_.decode_seconds += SecondsSince(t0);
      return absl::OkStatus();
    };
    return RunSchedule(send_own, reduce, gather);
  }

  // Codec fp32: raw payloads, the same schedule and the same float operations as RunRing (own + received,
  // then / float(M) at the owner), but no encoding, no checksum and no copy on the sending side: every
  // message points into input_ or result_ (zero copy, see ReleaseZeroCopy). A partial sum sent from
  // result_[r] is overwritten only by the all-gather of the same chunk, which cannot arrive before the
  // successor has received (so ZeroMQ has written) that partial sum.
  absl::Status RunRingRaw() {
    const size_t m = M();
    auto send_own = [&](size_t c, size_t j, const ValueRange& r) -> absl::Status {
      if (absl::Status s = SendZeroCopy(MessageType::kReduceScatter, 0, c, j, r, input_.data() + r.begin); !s.ok()) {
        return Fail(s, succ_);
      }
      return absl::OkStatus();
    };
    auto reduce = [&](size_t s, size_t c, size_t j, const ValueRange& r, bool last, Message& msg) -> absl::Status {
      const Clock::time_point t0 = Clock::now();
      const auto* received = static_cast<const uint8_t*>(msg.payload.data());
      float* dst = result_.data() + r.begin;
      const float* own = input_.data() + r.begin;
      const bool finite = last && op_ == ReduceOp::kMean
                              ? kernels::AddDivideChecked(own, received, r.size(), static_cast<float>(m), dst)
                              : kernels::AddChecked(own, received, r.size(), dst);
      stats_.decode_seconds += SecondsSince(t0);
      if (!finite) {
        size_t blamed = self_;
        absl::Status error = NonFiniteSum(msg, r, &blamed);
        return Fail(error, blamed);
      }
      // The owner's copy of its final chunk is the very bits it sends.
      if (absl::Status st = SendZeroCopy(last ? MessageType::kAllGather : MessageType::kReduceScatter, last ? 0 : s + 1,
                                         c, j, r, dst);
          !st.ok()) {
        return Fail(st, succ_);
      }
      return absl::OkStatus();
    };
    auto gather = [&](size_t c, size_t /*j*/, const ValueRange& r, Message& msg) -> absl::Status {
      const Clock::time_point t0 = Clock::now();
      const bool finite =
          kernels::CopyChecked(static_cast<const uint8_t*>(msg.payload.data()), r.size(), result_.data() + r.begin);
      stats_.decode_seconds += SecondsSince(t0);
      if (finite) return absl::OkStatus();
      const size_t at = FirstNonFinite({result_.data() + r.begin, r.size()});
      return Fail(absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": all-gather values of chunk ",
                                                        c, " from member ", Name(pred_), " hold NaN/Inf at index ",
                                                        r.begin + at, " (the chunk's owner is ",
                                                        Name(Mod(static_cast<int64_t>(c) - 1, m)), ")")),
                  pred_);
    };
    return RunSchedule(send_own, reduce, gather);
  }

  static size_t FirstNonFinite(std::span<const float> x) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(x[i])) return i;
    }
    return x.size();
  }

  // A reduce-scatter sum that is not finite: says whose values held the NaN/Inf (this member's own, or what
  // the predecessor sent: at step 0 that is its own values) or that the sum overflowed, and whom to blame.
  absl::Status NonFiniteSum(const Message& msg, const ValueRange& r, size_t* blamed) const {
    const size_t i = FirstNonFinite({result_.data() + r.begin, r.size()});
    float received = 0;
    std::memcpy(&received, static_cast<const uint8_t*>(msg.payload.data()) + i * sizeof(float), sizeof(float));
    const size_t index = r.begin + i;
    if (!std::isfinite(input_[index])) {
      *blamed = self_;
      return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_),
                                                   " cannot add its own values: value ", index,
                                                   " is NaN/Inf (every member must pass finite values)"));
    }
    if (!std::isfinite(received)) {
      *blamed = pred_;
      if (msg.header.step == 0) {
        return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(pred_),
                                                     " sent non-finite values: its own values "
                                                     "hold NaN/Inf at index ",
                                                     index, " (every member must pass finite values)"));
      }
      return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": the running sum that member ",
                                                   Name(pred_), " sent (step ", msg.header.step,
                                                   ") holds NaN/Inf at index ", index,
                                                   " (a member's values are NaN/Inf or the sum "
                                                   "overflowed)"));
    }
    *blamed = self_;
    return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_),
                                                 ": the sum overflowed fp32 at index ", index, " (", input_[index],
                                                 " + ", received, ")"));
  }

  // ---- Encoding. Both return a heap buffer that Send hands to ZeroMQ without copying.
  // Reduce-scatter: encode work[r] (or this member's own values, from_input) + residual; the residual
  // keeps what the codec lost.
  absl::StatusOr<std::unique_ptr<std::vector<uint8_t>>> EncodePartial(const ValueRange& r, bool from_input) {
    const Clock::time_point t0 = Clock::now();
    std::span<float> x(result_.data() + r.begin, r.size());
    auto out = pool_->Acquire();
    if (from_input && residual_.empty()) {
      // Nothing to add: encode the caller's values directly (work[r] is overwritten in the all-gather).
      if (absl::Status s = codec_->Encode(input_.subspan(r.begin, r.size()), out.get()); !s.ok()) {
        return EncodeError(s, r, true);
      }
      stats_.encode_seconds += SecondsSince(t0);
      return out;
    }
    if (from_input) std::copy(input_.begin() + r.begin, input_.begin() + r.end, x.begin());
    if (!residual_.empty()) {
      std::span<float> res = residual_.subspan(r.begin, r.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] += res[i];
      if (absl::Status s = codec_->Encode(x, out.get()); !s.ok()) return EncodeError(s, r, from_input);
      // residual = x - decode(payload), computed as residual = x, then residual -= decoded.
      std::copy(x.begin(), x.end(), res.begin());
      if (absl::Status s = codec_->DecodeAccumulate(*out, -1.0f, res); !s.ok()) return s;
    } else if (absl::Status s = codec_->Encode(x, out.get()); !s.ok()) {
      return EncodeError(s, r, from_input);
    }
    stats_.encode_seconds += SecondsSince(t0);
    return out;
  }

  // The owner's final chunk: (sum + residual) [/ M], encoded once. With error feedback the residual becomes
  // what the all-gather encoding lost, in sum units. work[r] is left holding the pre-encoding values; the
  // caller decodes the payload over it.
  absl::StatusOr<std::unique_ptr<std::vector<uint8_t>>> EncodeFinal(const ValueRange& r) {
    const Clock::time_point t0 = Clock::now();
    std::span<float> x(result_.data() + r.begin, r.size());
    std::span<float> res = residual_.empty() ? std::span<float>() : residual_.subspan(r.begin, r.size());
    if (!res.empty()) {
      for (size_t i = 0; i < x.size(); ++i) x[i] += res[i];
    }
    if (op_ == ReduceOp::kMean) {
      const auto m = static_cast<float>(M());
      for (float& v : x) v /= m;
    }
    auto out = pool_->Acquire();
    if (absl::Status s = codec_->Encode(x, out.get()); !s.ok()) return EncodeError(s, r, M() == 1);
    if (!res.empty()) {
      std::copy(x.begin(), x.end(), res.begin());
      if (absl::Status s = codec_->DecodeAccumulate(*out, -1.0f, res); !s.ok()) return s;
      if (op_ == ReduceOp::kMean) {
        const auto m = static_cast<float>(M());
        for (float& v : res) v *= m;
      }
    }
    stats_.encode_seconds += SecondsSince(t0);
    return out;
  }

  // `own` when the values encoded are this member's own (reduce-scatter step 0); otherwise they are a
  // partial or final sum, which can only be non-finite if some member's values were or the sum overflowed.
  absl::Status EncodeError(const absl::Status& s, const ValueRange& r, bool own) const {
    return absl::Status(s.code(), fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_),
                                             " could not encode ", own ? "its own values" : "the running sum of", " [",
                                             r.begin, ", ", r.end, ") with ", options_.codec,
                                             own ? ""
                                                 : " (a member's values are NaN/Inf or the sum "
                                                   "overflowed)",
                                             ": ", fl::ToStd(s.message()), " (index relative to ", r.begin, ")"));
  }

  absl::Status DecodeInto(const std::vector<uint8_t>& payload, const ValueRange& r) {
    const Clock::time_point t0 = Clock::now();
    absl::Status s = codec_->Decode(payload, {result_.data() + r.begin, r.size()});
    stats_.decode_seconds += SecondsSince(t0);
    return s;
  }

  static std::span<const uint8_t> PayloadOf(const zmq::message_t& msg) {
    return {static_cast<const uint8_t*>(msg.data()), msg.size()};
  }

  absl::Status PayloadError(const absl::Status& s, const Message& msg) const {
    return absl::DataLossError(fl::StrCat("ring exchange ", exchange_id_, ": ", wire::MessageTypeName(msg.header.type),
                                          " payload from member ", Name(pred_), " (step ", msg.header.step, ", chunk ",
                                          msg.header.chunk, ", sub-chunk ", msg.header.sub,
                                          ") is invalid: ", fl::ToStd(s.message())));
  }

  // ---- Sending.
  Header MakeHeader(MessageType type, size_t step, size_t chunk, size_t sub, const ValueRange& r) const {
    Header h;
    h.type = type;
    h.ring = fingerprint_;
    h.exchange_id = exchange_id_;
    h.sender = static_cast<uint32_t>(self_);
    h.step = static_cast<uint32_t>(step);
    h.chunk = static_cast<uint32_t>(chunk);
    h.sub = static_cast<uint32_t>(sub);
    h.offset = r.begin;
    h.count = r.size();
    h.total = n_;
    h.payload = raw_ && (type == MessageType::kReduceScatter || type == MessageType::kAllGather) ? PayloadKind::kRawFp32
                                                                                                 : PayloadKind::kCodec;
    return h;
  }

  absl::Status Send(MessageType type, size_t step, size_t chunk, size_t sub, const ValueRange& r,
                    std::unique_ptr<std::vector<uint8_t>> payload) {
    // Zero copy: ZeroMQ hands the buffer back to the pool once the I/O thread has written it.
    auto* in_flight = new InFlight{std::move(payload), pool_};
    HandOff(in_flight);
    zmq::message_t frame(in_flight->buffer->data(), in_flight->buffer->size(), &ReleaseBuffer, in_flight);
    return SendFrames(type, step, chunk, sub, r, std::move(frame));
  }

  // Raw fp32 values [r) from `data`, zero copy: ZeroMQ reads them from `data` until it calls ZeroCopyDone.
  absl::Status SendZeroCopy(MessageType type, size_t step, size_t chunk, size_t sub, const ValueRange& r,
                            const float* data) {
    const Clock::time_point t0 = Clock::now();
    zmq::message_t frame;
    if (r.size() > 0) {
      zero_copy_.Add();
      frame.rebuild(const_cast<float*>(data), r.size() * sizeof(float), &ZeroCopyDone, &zero_copy_);
    }
    absl::Status s = SendFrames(type, step, chunk, sub, r, std::move(frame));
    stats_.encode_seconds += SecondsSince(t0);
    return s;
  }

  absl::Status SendFrames(MessageType type, size_t step, size_t chunk, size_t sub, const ValueRange& r,
                          zmq::message_t payload) {
    zmq::socket_t& push = push_[sub % push_.size()];  // stripes sub-chunks over the connections
    return SendOn(push, MakeHeader(type, step, chunk, sub, r), std::move(payload));
  }

  absl::Status SendOn(zmq::socket_t& push, const Header& header, std::vector<uint8_t> payload) {
    return SendOn(push, header, zmq::message_t(payload.data(), payload.size()));
  }

  absl::Status SendOn(zmq::socket_t& push, const Header& header, zmq::message_t payload) {
    const auto head = wire::EncodeHeader(header);
    const uint64_t bytes = head.size() + payload.size();
    try {
      // The high-water mark is unlimited, so these never block; dontwait turns a surprise into an error.
      if (!push.send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
          !push.send(payload, zmq::send_flags::dontwait)) {
        return absl::UnavailableError(
            fl::StrCat("ring member ", Name(self_), " could not queue a message for ", Name(succ_)));
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          fl::StrCat("ring member ", Name(self_), " failed to send to ", Name(succ_), ": ", e.what()));
    }
    if (header.type != MessageType::kHello) stats_.bytes_sent += bytes;
    return absl::OkStatus();
  }

  // ---- Receiving.
  // The expected message: from the early map, or from the socket (keeping early ones, dropping stale ones),
  // watching the connections for a vanished neighbour, until the deadline.
  absl::StatusOr<Message> Receive(MessageType type, size_t step, size_t chunk, size_t sub, const ValueRange& r,
                                  bool sends_left) {
    const MessageKey key{static_cast<uint8_t>(type), static_cast<uint32_t>(step), static_cast<uint32_t>(chunk),
                         static_cast<uint32_t>(sub)};
    while (true) {
      if (auto it = early_.find(key); it != early_.end()) {
        Message msg = std::move(it->second);
        early_.erase(it);
        if (absl::Status s = CheckExpected(msg, r); !s.ok()) return s;
        stats_.bytes_received += msg.frame_bytes;
        return msg;
      }
      // Drain the data socket first: a neighbour that sent its last message and then closed must be read
      // before its disconnection is noticed.
      auto got = ReadOne(/*wait=*/false);
      if (!got.ok()) return got.status();
      if (*got) continue;
      if (absl::Status s = CheckMonitors(sends_left); !s.ok()) return s;
      const auto now = Clock::now();
      if (now >= deadline_) {
        return absl::DeadlineExceededError(fl::StrCat(
            "ring exchange ", exchange_id_, ": member ", Name(self_), " received nothing from its predecessor ",
            Name(pred_), " within ", absl::FormatDuration(options_.timeout), " (waiting for ",
            wire::MessageTypeName(type), " step ", step, ", chunk ", chunk, ", sub-chunk ", sub,
            "); that member, or one before it in the ring, has stalled or vanished", CurveRefusals()));
      }
      const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - now);
      std::vector<zmq::pollitem_t> items;
      items.push_back({pull_.handle(), 0, ZMQ_POLLIN, 0});
      for (auto& mon : monitors_) items.push_back({mon.handle(), 0, ZMQ_POLLIN, 0});
      try {
        zmq::poll(items, wait_ms);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return absl::InternalError(fl::StrCat("ring: zmq poll failed: ", e.what()));
      }
    }
  }

  // Reads one multipart message from the data socket if one is there (or, with wait, until one is) and files
  // it: returns true when something was read. Errors are malformed messages or aborts.
  absl::StatusOr<bool> ReadOne(bool wait) {
    zmq::message_t head;
    const auto flags = wait ? zmq::recv_flags::none : zmq::recv_flags::dontwait;
    if (!pull_.recv(head, flags)) return false;
    const int fd = zmq_msg_get(head.handle(), ZMQ_SRCFD);  // -1 when unknown
    std::vector<zmq::message_t> rest;
    // The remaining frames of a multipart message arrive together with the first.
    for (bool more = head.more(); more;) {
      zmq::message_t frame;
      if (!pull_.recv(frame)) break;
      more = frame.more();
      rest.push_back(std::move(frame));
    }
    if (rest.size() != 1) {
      return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_),
                                                   " received a message of ", rest.size() + 1,
                                                   " frames, expected 2 (header, payload)"));
    }
    auto header = wire::DecodeHeader(PayloadOf(head));
    if (!header.ok()) {
      return absl::InvalidArgumentError(
          fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_),
                     " received a malformed message: ", fl::ToStd(header.status().message())));
    }
    if (header->ring != fingerprint_) {  // another ring configuration (an older membership): not ours
      ++stats_.stale_discarded;
      return true;
    }
    if (header->sender != pred_) {
      return absl::InvalidArgumentError(
          fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(self_), " received a ",
                     wire::MessageTypeName(header->type), " message from member index ", header->sender,
                     " but only its predecessor ", Name(pred_), " sends to it (ring orders differ between members?)"));
    }
    if (header->type == MessageType::kHello) {
      const std::string mode(static_cast<const char*>(rest[0].data()), rest[0].size());
      if (!options_.sync_mode.empty() && !mode.empty() && mode != options_.sync_mode) {
        return absl::FailedPreconditionError(fl::StrCat(
            "ring member ", Name(pred_), " runs sync mode '", mode, "' but member ", Name(self_), " runs '",
            options_.sync_mode, "': every island of a ring must sync the same way; start them all with one --mode"));
      }
      if (fd >= 0) pred_fds_.insert(fd);
      return true;
    }
    const uint64_t frame_bytes = head.size() + rest[0].size();
    Message msg{*header, std::move(rest[0]), frame_bytes};
    if (header->exchange_id < exchange_id_) {
      ++stats_.stale_discarded;
      return true;
    }
    if (header->exchange_id > exchange_id_) {  // the predecessor is already on a later exchange
      future_[header->exchange_id].push_back(std::move(msg));
      return true;
    }
    if (absl::Status s = Accept(std::move(msg)); !s.ok()) return s;
    return true;
  }

  // Files a message of the current exchange in the early map after checking that it is one this exchange
  // expects from the predecessor; an abort fails the exchange.
  absl::Status Accept(Message msg) {
    const Header& h = msg.header;
    if (h.type == MessageType::kAbort) {
      aborted_by_ = h.sub < M() ? h.sub : pred_;
      abort_reason_.assign(static_cast<const char*>(msg.payload.data()), msg.payload.size());
      const std::string& reason = abort_reason_;
      const auto code = h.step <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)
                            ? static_cast<absl::StatusCode>(h.step)
                            : absl::StatusCode::kUnavailable;
      blamed_ = h.chunk < M() ? h.chunk : pred_;
      return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnavailable : code,
                          fl::StrCat(reason, " [reported to ", Name(self_), " by ", Name(*aborted_by_), "]"));
    }
    const size_t m = M();
    const auto self = static_cast<int64_t>(self_);
    if (h.step + 1 >= m) return Malformed(h, fl::StrCat("step ", h.step, " is beyond the last step ", m - 2));
    const size_t want_chunk =
        h.type == MessageType::kReduceScatter ? Mod(self - h.step - 1, m) : Mod(self - static_cast<int64_t>(h.step), m);
    if (h.chunk != want_chunk) {
      return Malformed(h, fl::StrCat("chunk ", h.chunk, " where step ", h.step, " carries chunk ", want_chunk));
    }
    const size_t subs = NumSubChunks(Chunk(want_chunk).size(), sub_values());
    if (h.sub >= subs) {
      return Malformed(h, fl::StrCat("sub-chunk ", h.sub, " of a chunk with ", subs,
                                     " (do all members use the same sub_chunk_values?)"));
    }
    const MessageKey key = KeyOf(h);
    if (early_.count(key) != 0) return Malformed(h, "a duplicate of a message already received");
    early_.emplace(key, std::move(msg));
    return absl::OkStatus();
  }

  absl::Status CheckExpected(const Message& msg, const ValueRange& r) const {
    const Header& h = msg.header;
    if (h.total != n_) {
      return Malformed(h, fl::StrCat("a vector of ", h.total, " values where this member reduces ", n_,
                                     " (every member must pass the same values.size())"));
    }
    if (h.offset != r.begin || h.count != r.size()) {
      return Malformed(
          h, fl::StrCat("values [", h.offset, ", +", h.count, ") where [", r.begin, ", +", r.size(), ") was expected"));
    }
    if (raw_) {
      if (h.payload != PayloadKind::kRawFp32) {
        return Malformed(h, fl::StrCat("a ", wire::PayloadKindName(h.payload),
                                       " payload where this member "
                                       "uses codec fp32 (raw fp32 values): every member of a ring must use the "
                                       "same codec"));
      }
      if (msg.payload.size() != r.size() * sizeof(float)) {
        return Malformed(h, fl::StrCat("a raw fp32 payload of ", msg.payload.size(), " bytes where ", r.size(),
                                       " values take ", r.size() * sizeof(float)));
      }
      return absl::OkStatus();
    }
    if (h.payload != PayloadKind::kCodec) {
      return Malformed(h, fl::StrCat("a ", wire::PayloadKindName(h.payload), " payload where this member uses ",
                                     options_.codec, ": every member of a ring must use the same codec"));
    }
    auto info = fl::core::PeekPayload(PayloadOf(msg.payload));
    if (!info.ok()) return Malformed(h, fl::StrCat("a bad payload: ", fl::ToStd(info.status().message())));
    if (info->kind != codec_->kind() || info->block_size != codec_->block_size()) {
      return Malformed(h, fl::StrCat("a ", fl::core::CodecKindName(info->kind), " payload (block ", info->block_size,
                                     ") where this member uses ", options_.codec,
                                     ": every member of a ring must use the same codec"));
    }
    if (info->num_values != r.size()) {
      return Malformed(h, fl::StrCat("a payload of ", info->num_values, " values in a message of ", r.size()));
    }
    return absl::OkStatus();
  }

  absl::Status Malformed(const Header& h, const std::string& what) const {
    return absl::InvalidArgumentError(fl::StrCat("ring exchange ", exchange_id_, ": ", wire::MessageTypeName(h.type),
                                                 " message from member ", Name(pred_), " (step ", h.step, ", chunk ",
                                                 h.chunk, ", sub-chunk ", h.sub, ") has ", what));
  }

  absl::Status CheckMonitors(bool sends_left) {
    for (size_t i = 0; i < monitors_.size(); ++i) {
      zmq::message_t event;
      while (monitors_[i].recv(event, zmq::recv_flags::dontwait)) {
        uint16_t id = 0;
        int32_t value = -1;
        if (event.size() >= 6) {
          std::memcpy(&id, event.data(), 2);
          std::memcpy(&value, static_cast<const uint8_t*>(event.data()) + 2, 4);
        }
        while (event.more()) (void)monitors_[i].recv(event);  // the endpoint frame
        if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && i > 0) {
          // Nothing this member sends can reach the successor: fail now rather than at the timeout.
          return absl::PermissionDeniedError(
              fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(succ_),
                         " refused the CurveZMQ handshake of ", Name(self_), " (ZAP status ", value,
                         "): this member's public key is not among the ring's keys "
                         "there; give every island the same provisioned islands/ folder (fl-provision add-island, "
                         "docs/security.md)"));
        }
        if (id != ZMQ_EVENT_DISCONNECTED) continue;
        if (i == 0) {  // the bound socket: only the predecessor's connections matter
          if (pred_fds_.erase(value) == 0) continue;
          return absl::UnavailableError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(pred_),
                                                   " disconnected from ", Name(self_), " mid-exchange"));
        }
        if (sends_left) {
          return absl::UnavailableError(fl::StrCat("ring exchange ", exchange_id_, ": member ", Name(succ_),
                                                   " disconnected from ", Name(self_), " mid-exchange"));
        }
      }
    }
    return absl::OkStatus();
  }

  // What the authenticator refused, for a timeout's message: a predecessor whose key is not in the ring's set
  // looks, from here, exactly like a silent one.
  std::string CurveRefusals() const {
    if (zap_ == nullptr || zap_->refused() == 0) return "";
    return fl::StrCat("; CurveZMQ refused ", zap_->refused(),
                      " connection(s) whose public key is not one of the "
                      "ring's members (last: ",
                      zap_->last_refused_key(), ")");
  }

  // ---- Failure: tell the successor (who tells the rest), so that every member fails fast and blames the
  // same peer. `blamed` is the member at fault for a local error; an abort received keeps its own blame.
  absl::Status Fail(const absl::Status& status, size_t blamed) {
    if (push_.empty()) return status;
    size_t originator = self_;
    std::string text(fl::ToStd(status.message()));
    if (aborted_by_.has_value()) {  // pass the abort on as it came
      originator = *aborted_by_;
      blamed = blamed_.value_or(blamed);
      text = abort_reason_;
      aborted_by_.reset();
      blamed_.reset();
    }
    // Stop where the abort started, or where it would reach the member at fault if that one has vanished
    // or stalled. A member blamed for what it sent (bad data: NaN/Inf, a malformed message) is alive and
    // waiting for the rest of the exchange, so it gets the abort too and fails at once, naming itself.
    const bool blamed_gone =
        status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kDeadlineExceeded;
    if (succ_ != originator && !(succ_ == blamed && blamed_gone)) {
      Header h = MakeHeader(MessageType::kAbort, static_cast<size_t>(status.code()), blamed, originator, ValueRange{});
      (void)SendOn(push_[0], h, std::vector<uint8_t>(text.begin(), text.end()));
    }
    return status;
  }

  RingOptions options_;
  size_t self_ = 0, succ_ = 0, pred_ = 0;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<fl::core::Codec> codec_;
  bool lossy_ = false;
  bool raw_ = false;  // codec fp32: raw payloads, RunRingRaw
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();

  ZeroCopyTracker zero_copy_;  // declared before context_: outlives it (the context releases last messages)
  zmq::context_t context_;
  std::unique_ptr<ZapAuthenticator> zap_;  // CurveZMQ only; destroyed before the context terminates
  zmq::socket_t pull_;
  std::vector<zmq::socket_t> push_;
  std::vector<zmq::socket_t> monitors_;  // [0] watches pull_, [1 + k] watches push_[k]
  std::string bound_endpoint_;
  std::set<int> pred_fds_;   // connections the predecessor said hello on
  int push_generation_ = 0;  // bumped when the push sockets are replaced (monitor addresses stay unique)
  absl::Status reconnect_error_;

  bool has_last_exchange_ = false;
  uint64_t last_exchange_id_ = 0;
  std::map<uint64_t, std::vector<Message>> future_;  // messages of later exchanges, by exchange id
  std::unordered_map<uint64_t, std::vector<float>> residuals_;

  // State of the exchange in progress.
  uint64_t exchange_id_ = 0;
  Clock::time_point deadline_;
  ReduceOp op_ = ReduceOp::kMean;
  std::vector<float> scratch_;    // the in-place call's result, kept across exchanges
  size_t n_ = 0;                  // values in the exchange
  std::span<const float> input_;  // the caller's values: never written
  std::span<float> result_;       // where the result is built: the caller's out, or scratch_
  std::span<float> residual_;
  std::map<MessageKey, Message> early_;
  ExchangeStats stats_;
  std::optional<size_t> aborted_by_;
  std::optional<size_t> blamed_;
  std::string abort_reason_;
};

absl::StatusOr<std::unique_ptr<RingAllReduce>> RingAllReduce::Create(const RingOptions& options) {
  if (options.members.empty()) return absl::InvalidArgumentError("RingOptions.members is empty");
  if (options.self >= options.members.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("RingOptions.self is ", options.self, " but the ring has ", options.members.size(), " members"));
  }
  std::set<std::string> ids, endpoints;
  for (size_t i = 0; i < options.members.size(); ++i) {
    const RingMember& m = options.members[i];
    if (m.id.empty() || m.endpoint.empty()) {
      return absl::InvalidArgumentError(fl::StrCat("RingOptions.members[", i, "] needs an id and an endpoint"));
    }
    if (m.endpoint.rfind("inproc://", 0) == 0) {
      return absl::InvalidArgumentError(fl::StrCat("RingOptions.members[", i, "].endpoint '", m.endpoint,
                                                   "': inproc is not supported (each member has its own "
                                                   "ZeroMQ context); use tcp:// or ipc://"));
    }
    if (!ids.insert(m.id).second) {
      return absl::InvalidArgumentError(fl::StrCat("RingOptions.members: id '", m.id, "' appears twice"));
    }
    if (!endpoints.insert(m.endpoint).second) {
      return absl::InvalidArgumentError(fl::StrCat("RingOptions.members: endpoint '", m.endpoint, "' appears twice"));
    }
  }
  if (options.connections_per_peer < 1 || options.connections_per_peer > 16) {
    return absl::InvalidArgumentError(
        fl::StrCat("RingOptions.connections_per_peer is ", options.connections_per_peer, ", expected 1..16"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fl::StrCat("RingOptions.timeout is ", absl::FormatDuration(options.timeout), ", expected > 0"));
  }
  if (options.sub_chunk_values == 0) return absl::InvalidArgumentError("RingOptions.sub_chunk_values is 0");
  if (options.linger < absl::ZeroDuration()) return absl::InvalidArgumentError("RingOptions.linger is < 0");
  if (options.curve.has_value()) {
    if (absl::Status s = CheckCurveSupport(); !s.ok()) return s;
    const RingCurve& c = *options.curve;
    if (c.public_keys.size() != options.members.size()) {
      return absl::InvalidArgumentError(fl::StrCat("RingOptions.curve has ", c.public_keys.size(), " public keys for ",
                                                   options.members.size(),
                                                   " members; it needs one per member, in ring order"));
    }
    for (size_t i = 0; i < c.public_keys.size(); ++i) {
      if (!IsZ85Key(c.public_keys[i])) {
        return absl::InvalidArgumentError(fl::StrCat("RingOptions.curve: the public key of member '",
                                                     options.members[i].id,
                                                     "' is not 40 characters of Z85 (fl-provision add-island)"));
      }
    }
    std::array<char, 41> derived{};
    if (!IsZ85Key(c.secret_key) || zmq_curve_public(derived.data(), c.secret_key.c_str()) != 0 ||
        std::string(derived.data(), 40) != c.public_keys[options.self]) {
      return absl::InvalidArgumentError(fl::StrCat(
          "RingOptions.curve: the secret key is not 40 characters of Z85 or does not belong to the public key of "
          "this member '",
          options.members[options.self].id,
          "'; use the .curve.key and .curve.pub that "
          "fl-provision add-island wrote together"));
    }
  }
  auto impl = std::make_unique<Impl>(options);
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<RingAllReduce>(new RingAllReduce(std::move(impl)));
}

RingAllReduce::RingAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RingAllReduce::~RingAllReduce() = default;

absl::Status RingAllReduce::AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<float> values, ReduceOp op,
                                      ExchangeStats* stats) {
  return impl_->AllReduce(exchange_id, residual_key, values, op, stats);
}

absl::Status RingAllReduce::AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<const float> in,
                                      std::span<float> out, ReduceOp op, ExchangeStats* stats) {
  return impl_->AllReduce(exchange_id, residual_key, in, out, op, stats);
}

void RingAllReduce::ResetResidual(uint64_t residual_key) { impl_->ResetResidual(residual_key); }
std::span<const float> RingAllReduce::Residual(uint64_t residual_key) const { return impl_->Residual(residual_key); }
absl::Status RingAllReduce::SetCodec(const std::string& codec_spec) { return impl_->SetCodec(codec_spec); }
const RingOptions& RingAllReduce::options() const { return impl_->options(); }
const std::string& RingAllReduce::bound_endpoint() const { return impl_->bound_endpoint(); }

}  // namespace fl::diloco

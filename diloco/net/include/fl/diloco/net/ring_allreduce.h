// RingAllReduce: the cross-island data plane. Island leaders average (or sum) a pseudo-gradient fragment
// peer to peer over ZeroMQ with a ring all-reduce, encoded with any fl::core codec, so that every member
// sends about 2(M-1)/M of the (encoded) fragment per exchange and every member ends with the SAME BITS.
//
// Usage (one instance per island leader, for one ring membership):
//   RingOptions options;
//   options.members = {{"island-a", "tcp://10.0.0.1:5555"}, {"island-b", "tcp://10.0.0.2:5555"}, ...};
//   options.self = 1;                 // this process is island-b: it binds tcp://10.0.0.2:5555
//   options.codec = "int8";           // any fl::core::MakeCodec spec
//   auto ring = RingAllReduce::Create(options);          // binds and connects; does not wait for peers
//   ExchangeStats stats;
//   absl::Status s = (*ring)->AllReduce(/*exchange_id=*/outer_step * 1000 + fragment,
//                                       /*residual_key=*/fragment, values, ReduceOp::kMean, &stats);
//   // or, out of place (no final copy of the whole vector; `result` is a buffer kept across exchanges):
//   s = (*ring)->AllReduce(exchange_id, fragment, std::span<const float>(values), result, ReduceOp::kMean,
//                          &stats);
// Every member must call AllReduce with the same exchange_id, the same values.size(), op and codec (members
// may mix the in-place and out-of-place calls: the wire does not differ).
//
// Algorithm (M members, member r, ring order = options.members):
//   values are cut into M contiguous chunks, chunk c = [c*n/M, (c+1)*n/M) (floor division, so chunk sizes
//   differ by at most one and chunks may be empty when n < M). Member r sends to r+1 and receives from r-1.
//   Reduce-scatter, M-1 steps: at step 0 member r sends chunk r; at step s it receives the running partial
//   sum of chunk r-s-1, adds its own values and (if s < M-2) sends it on. Chunk c is therefore summed in
//   ring order starting at member c: ((x_c + x_{c+1}) + x_{c+2}) + ... + x_{c-1} (indices mod M, fp32,
//   left fold), and ends complete at member c-1, its OWNER. With ReduceOp::kMean the owner then divides by
//   float(M) (one correctly rounded division).
//   All-gather, M-1 steps: the owner encodes its final chunk ONCE and sends those bytes around the ring;
//   every member (the owner included, which replaces its own values with decode(encode(final))) decodes
//   the same bytes, so results are bit-identical on every member for every codec. Receivers forward the
//   received bytes unchanged (no re-encoding).
//   With a lossy codec every reduce-scatter hop encodes its running partial sum, so errors add up over
//   the hops: per value at most sum over hops of the codec's bound for what that hop sent (see codec.h).
//   With fp32 the result equals the left fold above bit for bit. With fp32 nothing is encoded: messages
//   carry the floats themselves, sent zero-copy from the caller's input and from the result being built.
//   Chunks are cut into sub-chunks of `sub_chunk_values` values, each its own message, so that sending,
//   receiving, decoding and adding overlap (ZeroMQ's I/O thread moves bytes while this thread computes).
//
// Error feedback (error_feedback = true; a no-op for fp32): a residual of values.size() floats is kept per
// residual_key (e.g. the fragment index). Whatever this member sends in reduce-scatter is
// encode(own + received + residual) and the part the codec lost becomes the new residual of those values;
// the owner keeps M * (final/M - decode(encode(final/M))) for a mean (the all-gather loss, in sum units).
// Over repeated exchanges the running mean of the results thus tracks the running mean of the true
// averages to within one exchange's error. Residuals change only when an exchange succeeds. A residual_key
// used again with a different values.size() is an error (call ResetResidual first).
//
// Wire format (each message is two ZeroMQ frames, little-endian):
//   frame 0, 64 bytes: u32 magic 'FLRG' | u8 version (2) | u8 type (1 hello, 2 reduce-scatter, 3 all-gather,
//     4 abort) | u16 payload kind (0 codec, 1 raw fp32) | u64 ring fingerprint (RingFingerprint(members)) |
//     u64 exchange_id | u32 sender index | u32 step | u32 chunk | u32 sub-chunk | u64 offset (first value,
//     in the whole vector) | u64 count (values) | u64 total (values.size())
//   frame 1, payload kind 0: the codec payload (codec.h: self-describing and checksummed); for an abort, a
//     UTF-8 reason, and `chunk` holds the index of the member blamed; for a hello, the sender's sync mode
//     (RingOptions::sync_mode, empty when unset).
//   frame 1, payload kind 1 (every data message of a ring with codec "fp32"): exactly `count` fp32 values,
//     no framing and no checksum (TCP already checks integrity; Gloo and NCCL do not checksum either).
//     NaN/Inf are still refused: the receiver checks every sum and every all-gather value it stores (the
//     check rides in the same loop as the addition), so a non-finite value fails the exchange naming the
//     member whose values held it (its own values when it sent them at reduce-scatter step 0, or this
//     member's own), or saying that the sum overflowed.
// Every received header is checked against the one expected (ring, sender = predecessor, type, step,
// chunk, sub-chunk, offset, count, total, payload kind; for codec payloads the codec kind and count via
// PeekPayload and the payload by Decode; for raw fp32 the size, count x 4 bytes).
// Version 1 (codec payloads for fp32 too, reserved field 0) is refused with an error naming both versions.
// Messages of another ring (fingerprint differs) or of an older exchange_id are discarded (counted in
// ExchangeStats::stale_discarded); messages of a newer exchange_id (a fast predecessor already on the next
// exchange) are kept until that exchange. Anything else malformed fails the exchange with InvalidArgument
// or DataLoss naming the sender.
//
// Failures. An exchange either completes on this member (values replaced by the result) or returns an
// error and leaves `values` (and the residuals) exactly as they were: the in-place call builds the result
// in scratch memory (kept across exchanges) and copies it over `values` only on success; the out-of-place
// call never writes `in` and leaves `out` unspecified on error. Whatever the outcome, AllReduce returns
// only once ZeroMQ has released every zero-copy message that points into `in`, `out` or the scratch, so
// the caller may change or free them at once (if the successor has stopped reading, the push sockets are
// closed with linger 0 and reconnected after at most `timeout` on success, 1 s on error; the successor
// may then fail its next exchange with Unavailable). Errors name the member at fault:
//   - Unavailable: a neighbour's connection closed while this member still needed it ("member 'island-c'
//     (tcp://...) disconnected during exchange 7"), or another member reported such a failure (the first
//     member to see a failure sends an abort around the ring, so that every member fails fast and names
//     the same peer instead of waiting for its own timeout);
//   - DeadlineExceeded: nothing arrived from the predecessor before `timeout` (measured from the start of
//     AllReduce) elapsed; names the predecessor (a silent, still-connected peer further upstream stalls
//     the ring the same way: the abort from the member nearest to it normally arrives first and names it);
//   - InvalidArgument / DataLoss: a malformed message (bad header, wrong sizes, other codec, corrupt
//     payload), naming the sender; NaN/Inf values or an fp32 sum that overflows, naming whose values
//     (InvalidArgument); InvalidArgument also for bad arguments of the call itself. The abort of such an
//     error also reaches the member blamed (it is alive and would otherwise wait for its timeout).
// After a failure the instance stays usable for later exchanges (with a larger exchange_id), but after a
// member vanished the coordinator normally builds a new ring without it (destroy this instance first: it
// holds the bound endpoint). A member returns OK once it holds the full result; a peer that fails after
// it has sent everything this member needs does not fail this member (the control plane's membership and
// state hashes handle such late failures).
//
// Threading: not thread-safe; one AllReduce at a time per instance, from any thread (e.g. a background
// thread that overlaps the exchange with inner steps). Each instance owns its own zmq::context_t.
// Torch-free: links only fl::core, Abseil and libzmq.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fl::diloco {

struct RingMember {
  std::string id;        // names the member in errors and logs ("island-3"); unique in the ring
  std::string endpoint;  // ZeroMQ endpoint this member BINDS, e.g. "tcp://127.0.0.1:5555"; unique in the ring
};

// CurveZMQ for the ring (docs/security.md): every connection is encrypted and authenticated. The bound (PULL)
// side is a CURVE server with this member's secret key and admits, through a ZAP handler, only the public keys
// in `public_keys`; each PUSH side is a CURVE client with this member's key pair and its successor's public key.
// A member whose key is not in its successor's set cannot deliver anything: it fails with PermissionDenied
// naming the successor, and the successor times out naming the refused key. Keys are Z85 text, 40 characters
// (fl-provision add-island writes them: islands/<name>.curve.pub, .curve.key).
struct RingCurve {
  std::string secret_key;                // this member's secret key
  std::vector<std::string> public_keys;  // every member's public key, in ring order (public_keys[self] is ours)
};

// OK when this process's libzmq has CURVE (zmq_has("curve")); otherwise Unavailable saying what to install.
absl::Status RingCurveSupported();

struct RingOptions {
  std::vector<RingMember> members;             // ring order, fixed by the coordinator; identical on every member
  size_t self = 0;                             // index of this member in `members`
  std::string codec = "fp32";                  // any fl::core::MakeCodec spec: fp32, bf16, int8[:block], int4, fp4 ...
  bool error_feedback = false;                 // keep the codec's residual per residual_key and add it next time
  int connections_per_peer = 1;                // stripes each transfer over N ZeroMQ connections (1..16)
  absl::Duration timeout = absl::Seconds(30);  // per exchange; a vanished peer -> Unavailable/DeadlineExceeded
  size_t sub_chunk_values = size_t{1} << 20;   // values per message (4 MiB of fp32); pipelining granularity
  absl::Duration linger = absl::Seconds(2);    // how long the destructor lets queued messages drain to live peers
  // What this member binds, when peers reach it through something in between (an emulated WAN link's relay,
  // a NAT): members[self].endpoint is then what the others dial. Empty = bind members[self].endpoint.
  std::string bind_endpoint;
  // Set: CurveZMQ on every connection (above). Unset: plaintext ZeroMQ (fl-island --insecure).
  std::optional<RingCurve> curve;
  // How this member syncs ("diloco", "onebit-adam", ...), sent in its hellos: a member whose predecessor runs
  // another mode fails its first exchange with FailedPrecondition naming both modes (and the abort reaches the
  // rest of the ring). "" = neither sent nor checked.
  std::string sync_mode;
};

enum class ReduceOp { kMean, kSum };

struct ExchangeStats {
  uint64_t bytes_sent = 0;       // bytes of every frame this member sent in the exchange (headers included)
  uint64_t bytes_received = 0;   // bytes of every frame it received and used
  double seconds = 0;            // wall time of AllReduce
  double encode_seconds = 0;     // time spent encoding (part of `seconds`); fp32: queueing zero-copy messages
  double decode_seconds = 0;     // time spent validating, decoding and adding received payloads
  uint64_t stale_discarded = 0;  // messages of an older exchange or another ring that were dropped
};

// A 64-bit fingerprint of the ring (ids and endpoints in order): tags every message so that messages of an
// older ring configuration reusing an endpoint are recognised and dropped.
uint64_t RingFingerprint(const std::vector<RingMember>& members);

// [begin, end) of chunk `chunk` of `num_values` values split among `num_members` (see above).
struct ValueRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};
ValueRange RingChunk(size_t num_values, size_t num_members, size_t chunk);

// Bytes one member sends in one exchange of `num_values` values with codec `codec_spec`: the encoded
// payloads (fp32: 4 bytes a value, raw) of its M-1 reduce-scatter and M-1 all-gather messages plus their
// 64-byte headers. About
// 2(M-1)/M times the encoded size of the whole vector. Errors: a bad codec spec, zero members.
absl::StatusOr<uint64_t> RingBytesSentPerMember(size_t num_values, size_t num_members, size_t self,
                                                const std::string& codec_spec, size_t sub_chunk_values);

// Optional, process-wide, call once at startup of a process that runs a ring (fl-island, the benchmark):
// raises glibc malloc's mmap threshold to 32 MiB and its trim threshold to 1 GiB, so that the 4 MiB
// messages ZeroMQ allocates for every received sub-chunk reuse heap memory instead of fresh pages, which
// the kernel must fault in and zero (about a fifth of an fp32 exchange's CPU time on the 2-core test VM).
// The price: freed memory goes back to the OS later. Returns false if glibc refused a setting.
// fl::core::KeepFreedMemory (fl/core/allocator.h) with its defaults; fl-client applies the same.
bool TuneAllocatorForLargeMessages();

class RingAllReduce {
 public:
  // Validates the options (members non-empty with unique non-empty ids and endpoints, self in range, codec
  // spec, connections_per_peer in [1, 16], timeout > 0, sub_chunk_values >= 1), binds members[self].endpoint
  // and connects to the successor's. Does not wait for peers: connections complete in the background.
  // Errors: InvalidArgument for bad options (with `curve`: a key that is not 40 characters of Z85, one public
  // key per member, a secret key that does not belong to public_keys[self]); Unavailable when the endpoint
  // cannot be bound (in use) or libzmq lacks CURVE.
  static absl::StatusOr<std::unique_ptr<RingAllReduce>> Create(const RingOptions& options);

  ~RingAllReduce();
  RingAllReduce(const RingAllReduce&) = delete;
  RingAllReduce& operator=(const RingAllReduce&) = delete;

  // Reduces `values` across all members in place (mean or sum); see the header comment for the order of
  // operations, the error cases and the guarantee that `values` is untouched on error. `exchange_id` must
  // be larger than that of every earlier call on this instance (retry a failed exchange with a new id,
  // e.g. outer_step * 1000 + fragment plus an attempt counter). `stats` may be null. With a single member
  // this is a local no-op for fp32 and values <- decode(encode(values)) (or the mean of one) otherwise,
  // so that a ring of one behaves like any other.
  absl::Status AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<float> values, ReduceOp op,
                         ExchangeStats* stats);

  // Out of place: reduces `in` and writes the result into `out` (same size, no overlap; the same span as
  // `in` means in place, as above). `in` is never written; on error `out` holds unspecified values (and the
  // residuals are unchanged). Saves the in-place call's final copy of the whole vector from scratch memory:
  // the result is built in `out` directly. With codec fp32, ZeroMQ sends straight from `in` and `out`;
  // both are released by ZeroMQ before this returns, success or error.
  absl::Status AllReduce(uint64_t exchange_id, uint64_t residual_key, std::span<const float> in, std::span<float> out,
                         ReduceOp op, ExchangeStats* stats);

  // Forgets the error-feedback residual of `residual_key` (e.g. when a fragment's layout changed).
  void ResetResidual(uint64_t residual_key);

  // The error-feedback residual kept for `residual_key` (values.size() floats: in the ranges this member sends
  // at reduce-scatter, what its encodings lost; in the chunk it owns, the reducer's loss of the all-gather
  // encoding, in sum units), or an empty span when there is none yet. Valid until the next call on this
  // instance. For tests (1-bit Adam's exchange against a one-process reference: docs/diloco.md).
  std::span<const float> Residual(uint64_t residual_key) const;

  // Switches the codec for later exchanges (any fl::core::MakeCodec spec), e.g. 1-bit Adam's move from exact
  // fp32 warm-up to sign1 momentum. Every member must switch before the same exchange: a member still on the
  // old codec fails it naming both codecs. Residuals are kept per residual_key (use another key for the new
  // codec, or ResetResidual). InvalidArgument naming the spec when it is not a codec (nothing changes then).
  absl::Status SetCodec(const std::string& codec_spec);

  const RingOptions& options() const;
  // The endpoint actually bound, as ZeroMQ reports it (ZMQ_LAST_ENDPOINT).
  const std::string& bound_endpoint() const;

 private:
  class Impl;
  explicit RingAllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::diloco

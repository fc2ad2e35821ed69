// Churn in 1-bit Adam: how islands that exchange every step join and leave through fl-coordinator
// (docs/diloco.md, "Churn in 1-bit Adam"). Torch-free.
//
// The coordinator's unit of agreement is a sync: a barrier (BeginSync) that fixes the ring, then every member's
// report with its state hash, a commit by the majority, and late joiners admitted only between syncs with the
// committed state. 1-bit Adam exchanges every step, and a barrier, a report and a hash every step would cost two
// coordinator round trips per step. So in `onebit-adam` one sync is a membership WINDOW of K steps
// (fl-coordinator --sync-mode onebit-adam --inner-steps K --outer-steps T/K): window w = sync (w, 0) covers
// steps wK+1 .. (w+1)K, all on the ring BeginSync(w) returned, with exchange ids (epoch << 24) + j.
//
// The state the members agree on at a window's end must be complete, because it is what the coordinator
// commits, what a late joiner copies and what a failed window is rolled back to. The error-feedback residuals
// are not shared: each island keeps what its own encodings lost and, on the chunk it owns in this ring, what
// re-encoding the average lost. So at every window's end (once the compression stage has begun) the members
// FOLD them: one fp32 all-reduce (mean) of each member's residual over the window's ring — the mass the later
// sign1 exchanges would have delivered, since each member's residual enters the chunk sums that the ring then
// divides by M — added to the shared momentum m, after which every residual is zero. m, v, the model, the step
// and the (zero) residuals are then bit-identical on every member and hashed (OneBitAdam::Hash).
//
// Then:
//   - a late joiner receives that image (FetchState, verified by its hash) and starts the next window;
//   - an island that dies mid-window fails the ring for everyone; nobody reports the window applied, the
//     coordinator answers RETRY, and the survivors roll back to the window's start (the last committed state,
//     which has no residuals) and run the window again on the new ring: the window's steps are lost, nothing
//     is half-applied, and no residual is dropped;
//   - the window's end costs one fp32 exchange of the model's size: with sign1 at 256 values a scale a step
//     sends ~1/28 of fp32, so K = 100 adds about 28% to the bytes of the compression stage. K trades that
//     against how long a joiner waits (at most one window) and how many steps a failure costs (at most one).
//
// The warm-up (exact fp32 Adam) has no residuals. With a lossy warm-up codec (data-parallel Adam in int8) the
// gradient residual cannot be folded into m and v exactly, so it is dropped at every window's end.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "fl/diloco/island/onebit_adam.h"
#include "fl/diloco/net/ring_allreduce.h"

namespace fl::diloco {

// The ring's residual keys in `onebit-adam`: the warm-up's gradients (a lossy warm-up codec only), the
// compressed momentum, and the fold's fp32 exchange (which keeps none).
inline constexpr uint64_t kOneBitGradientKey = 0;
inline constexpr uint64_t kOneBitMomentumKey = 1;
inline constexpr uint64_t kOneBitFoldKey = 2;

// Exchange ids within a window: (epoch << kWindowExchangeBits) + j, j = 1 .. K + 1 (the ring needs ids that
// grow on every instance, and an epoch grows with every window and every retry).
inline constexpr int kWindowExchangeBits = 24;

// The fold at a window's end, on every member of `ring` with the same `exchange_id`: the mean over the ring of
// every member's momentum residual (zeros where it has none), exchanged in fp32 (the ring's codec is switched
// for this exchange and back), added to `adam`'s momentum; then every residual of the ring is forgotten (the
// gradient key's too: dropped, see above). On an error nothing changes (the ring's codec is restored) and the
// caller treats the window as failed. `stats` may be null.
absl::Status FoldResidualsIntoMomentum(RingAllReduce& ring, uint64_t exchange_id, OneBitAdam& adam,
                                       ExchangeStats* stats);

}  // namespace fl::diloco

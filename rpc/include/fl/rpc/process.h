// Process-wide settings every gRPC binary of the project (fl-server, fl-client, fl-coordinator, fl-island) makes
// once at the start of main, before any thread exists.
#pragma once

namespace fl::rpc {

// Turns off absl::Mutex's deadlock detection. Debian builds Abseil without NDEBUG, which leaves the detection on
// (OnDeadlockCycle::kAbort): every lock of an absl::Mutex (gRPC takes them on every call, stream and completion)
// then updates a global lock-order graph under its own lock. Measured with perf on 100 virtual clients of 100k
// parameters: absl's GraphCycles took 2.9% of all samples (docs/performance.md). The graph only finds bugs in a
// debug build; the tests, which do not call this, keep it.
void DisableMutexDeadlockDetection();

}  // namespace fl::rpc

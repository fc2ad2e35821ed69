#include "fl/rpc/process.h"

#include "absl/synchronization/mutex.h"

namespace fl::rpc {

void DisableMutexDeadlockDetection() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace fl::rpc

// Must NOT compile under the clang-tsa preset: tools_thread_safety_rejects_unlocked_access checks that clang's
// thread-safety analysis is on and fails the build on a guarded field read without its lock, and on a call that
// requires a lock made without it (the two mistakes the annotations in the tree exist to catch).
#include "fl/core/mutex.h"

namespace {

class Counter {
 public:
  int Unlocked() const { return value_; }   // refused: no lock
  void BumpWithoutLock() { BumpLocked(); }  // refused: no lock
  void Bump() {
    fl::MutexLock lock(mu_);
    BumpLocked();
  }

 private:
  void BumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++value_; }

  mutable fl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Bump();
  c.BumpWithoutLock();
  return c.Unlocked();
}

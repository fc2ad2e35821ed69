// fl-client's pthread_attr_setstacksize (client/src/thread_stacks.cc) in a process whose static TLS does not fit a
// 100 KiB thread stack, as fl-client's does with OpenBLAS as the system BLAS: glibc's own function refuses such a
// thread; through fl-client's, threads asking for 100 KiB start, and so does prometheus-cpp's HTTP server (civetweb
// asks for exactly that), which is what broke fl-client --metrics-addr.
#include <dlfcn.h>
#include <pthread.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <prometheus/exposer.h>

#include "fl/testing/subprocess.h"

// 160 KiB of thread-local storage in the executable: static TLS, which every thread's stack must hold (OpenBLAS
// alone adds 60 KiB to LibTorch's). External and used through a volatile pointer, so that it is not optimised away.
thread_local char fl_thread_stacks_test_tls[160 * 1024];

namespace {

constexpr size_t kCivetwebStackBytes = 102400;  // Debian's civetweb: USE_STACK_SIZE

void* Touch(void* arg) {
  volatile char* tls = fl_thread_stacks_test_tls;
  tls[0] = 1;
  tls[sizeof(fl_thread_stacks_test_tls) - 1] = 2;
  *static_cast<int*>(arg) = tls[0] + tls[sizeof(fl_thread_stacks_test_tls) - 1];
  return nullptr;
}

// Starts a thread with a stack of `bytes` set through `set`; returns pthread_create's result.
int StartThread(int (*set)(pthread_attr_t*, size_t), size_t bytes, int* result) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  EXPECT_EQ(set(&attr, bytes), 0);
  pthread_t thread;
  const int created = pthread_create(&thread, &attr, Touch, result);
  pthread_attr_destroy(&attr);
  if (created == 0) pthread_join(thread, nullptr);
  return created;
}

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn Glibc() { return reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize")); }

TEST(ThreadStacksTest, GlibcRefusesA100KiBStackThatCannotHoldTheStaticTls) {
  // The premise of the fix: without it this process cannot start civetweb's threads.
  ASSERT_NE(Glibc(), nullptr);
  ASSERT_NE(Glibc(), &pthread_attr_setstacksize) << "fl-client's definition must come first";
  int result = 0;
  EXPECT_EQ(StartThread(Glibc(), kCivetwebStackBytes, &result), EINVAL);
}

TEST(ThreadStacksTest, ThroughFlClientsDefinitionA100KiBThreadStarts) {
  int result = 0;
  ASSERT_EQ(StartThread(&pthread_attr_setstacksize, kCivetwebStackBytes, &result), 0);
  EXPECT_EQ(result, 3);
}

TEST(ThreadStacksTest, SmallStacksAreRaisedAndLargerOnesKept) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  size_t size = 0;
  ASSERT_EQ(pthread_attr_setstacksize(&attr, kCivetwebStackBytes), 0);
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);
  EXPECT_EQ(size, size_t{1} << 20);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, size_t{8} << 20), 0);
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &size), 0);
  EXPECT_EQ(size, size_t{8} << 20);
  pthread_attr_destroy(&attr);
}

TEST(ThreadStacksTest, ThePrometheusHttpServerStartsAndServes) {
  const std::string addr = "127.0.0.1:" + std::to_string(fl::testing::FreeLoopbackPort());
  std::unique_ptr<prometheus::Exposer> exposer;
  ASSERT_NO_THROW(exposer = std::make_unique<prometheus::Exposer>(addr));
  EXPECT_FALSE(exposer->GetListeningPorts().empty());
}

}  // namespace

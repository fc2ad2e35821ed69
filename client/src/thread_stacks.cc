// Thread stacks large enough for the static TLS: a definition of pthread_attr_setstacksize in fl-client that
// raises a requested stack size below kMinThreadStackBytes to it and passes everything else through to glibc's.
//
// Why: glibc places a new thread's static TLS (the thread-local storage of every library loaded at start) at the
// top of the thread's own stack, and pthread_create fails with EINVAL when the requested stack cannot hold it.
// civetweb, the HTTP server under prometheus-cpp's Exposer (fl-client --metrics-addr), asks for fixed 100 KiB
// stacks (Debian builds it with USE_STACK_SIZE=102400). LibTorch links the system BLAS; with OpenBLAS as the system
// BLAS (deploy/install-deps.sh installs it: LibTorch's nn.Linear and nn.GRU run 1.6-10x faster than on the
// reference BLAS) the static TLS of fl-client grows past what 100 KiB holds, civetweb cannot start its threads and
// the metrics endpoint fails to start ("null context when constructing CivetServer"). The executable's definition
// comes first in the dynamic linker's lookup, so civetweb's call lands here (fl-client exports the symbol:
// client/CMakeLists.txt); glibc's own threads and callers asking for at least the minimum are unaffected. The
// cost of a larger stack is address space: its pages are only touched as the thread uses them.
#include <dlfcn.h>
#include <pthread.h>

#include <cerrno>
#include <cstddef>

namespace {

constexpr size_t kMinThreadStackBytes = size_t{1} << 20;

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn GlibcSetStackSize() {
  // The next definition after this executable's: libc's.
  static const SetStackSizeFn next = reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return next;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  const SetStackSizeFn next = GlibcSetStackSize();
  if (next == nullptr) return ENOSYS;
  return next(attr, stack_size < kMinThreadStackBytes ? kMinThreadStackBytes : stack_size);
}

# Compiler options for the project's own targets.
#
# Warnings are applied per target (fl_target_defaults), not globally, so that generated protobuf/gRPC
# sources and third-party headers do not drown our own diagnostics; FL_WERROR makes them fatal (ci preset).

if(FL_SANITIZE)
  # Applied globally: every object in a sanitized binary must be instrumented consistently.
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

if(FL_TSAN)
  if(FL_SANITIZE)
    message(FATAL_ERROR "FL_TSAN and FL_SANITIZE cannot be combined: ThreadSanitizer excludes AddressSanitizer")
  endif()
  # Global for the same reason. Debian's gRPC, protobuf and abseil stay uninstrumented: the races TSan reports
  # from inside them are listed, one reason per entry, in tools/tsan.supp (docs/architecture.md,
  # "Checked concurrency").
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

if(FL_THREAD_SAFETY_ANALYSIS AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "FL_THREAD_SAFETY_ANALYSIS needs clang (GCC ignores the annotations): use the clang-tsa preset")
endif()

function(fl_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wcast-align
                                           -Wunused -Woverloaded-virtual -Wimplicit-fallthrough)
  if(FL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(FL_THREAD_SAFETY_ANALYSIS)
    # The lock discipline written in the types (fl::Mutex, ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED) is
    # checked, and a violation fails the build even without FL_WERROR. -Wthread-safety-beta stays off: it
    # reports through libstdc++'s unannotated headers.
    target_compile_options(${target} PRIVATE -Wthread-safety -Werror=thread-safety)
  endif()
endfunction()

# fl_torch_pch(<target> [REUSE_FROM <other>])
#
# <torch/torch.h> as a precompiled header for a target whose translation units include LibTorch (issue 32 item 2):
# parsing it is most of each such file's compile time (docs/performance.md, "Build: LibTorch's compile cost").
# Without REUSE_FROM the target gets its own PCH; with it, the target uses <other>'s (one PCH for a library and its
# one-file tests: a PCH of its own would cost a test as much as it saves). The reusing target must be compiled with
# the same flags as <other>, which our targets are (fl_target_defaults; their own -D macros appear in no LibTorch
# header, and GCC accepts a PCH only where it is valid: -Winvalid-pch, an error here, says when not).
#
# ccache caches PCH users only with sloppiness pch_defines,time_macros and, for GCC, -fpch-preprocess (the ccache
# manual, "Precompiled headers"); set here for these targets alone, so the user's ccache configuration is left as it
# is. Without them every PCH user would be a ccache miss, and ccache is what makes rebuilds fast.
# No-op for a target that does not exist (tests off), where LibTorch is not built, or with -DFL_TORCH_PCH=OFF (the
# reference of bench/torch_compile_seconds.sh; or a compiler that refuses the PCH).
option(FL_TORCH_PCH "Precompile <torch/torch.h> for the targets that include LibTorch" ON)
function(fl_torch_pch target)
  cmake_parse_arguments(ARG "" "REUSE_FROM" "" ${ARGN})
  if(NOT FL_WITH_TORCH OR NOT FL_TORCH_PCH OR NOT TARGET ${target})
    return()
  endif()
  if(ARG_REUSE_FROM)
    target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  endif()
  if(FL_CCACHE_PROGRAM AND CMAKE_CXX_COMPILER_LAUNCHER STREQUAL FL_CCACHE_PROGRAM)
    set_target_properties(${target} PROPERTIES CXX_COMPILER_LAUNCHER
      "env;CCACHE_SLOPPINESS=pch_defines,time_macros;${FL_CCACHE_PROGRAM}")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -fpch-preprocess)
    endif()
  endif()
endfunction()

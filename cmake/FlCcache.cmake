# Use ccache when it is installed: LibTorch and generated gRPC sources are slow to compile.
find_program(FL_CCACHE_PROGRAM ccache)
if(FL_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER "${FL_CCACHE_PROGRAM}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${FL_CCACHE_PROGRAM}")
endif()

# fl_add_test(NAME <name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>] [TIMEOUT <s>])
#
# One test executable per test file (leveldb's habit), registered with CTest test by test through
# gtest_discover_tests so that `ctest -R` and labels work at the granularity of single tests.
# Every suite carries a speed label: `fast` (default) or `slow`; `ctest -L fast` runs the quick ones alone.
include(GoogleTest)

function(fl_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT FL_BUILD_TESTS)
    return()
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS fast)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  fl_target_defaults(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main)
  # The executable's name prefixes every test ("core_codec_test.CodecTest.Fp32RoundTrip"), so that
  # `ctest -R core_` selects a module. The labels list is joined with an escaped ';' because
  # gtest_discover_tests forwards PROPERTIES as a flat list.
  string(REPLACE ";" "\\;" labels_escaped "${ARG_LABELS}")
  gtest_discover_tests(${ARG_NAME}
    TEST_PREFIX "${ARG_NAME}."
    PROPERTIES LABELS "${labels_escaped}" TIMEOUT ${ARG_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()

# fl_add_module_tests(PREFIX <prefix> LIBS <targets...> [LABELS <labels...>])
#
# One test executable `<prefix>_<file>` per `test/*_test.cc` of the calling directory (leveldb's habit).
function(fl_add_module_tests)
  cmake_parse_arguments(ARG "" "PREFIX" "LIBS;LABELS" ${ARGN})
  file(GLOB test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/test/*_test.cc)
  foreach(test_source ${test_sources})
    get_filename_component(test_name ${test_source} NAME_WE)
    fl_add_test(NAME ${ARG_PREFIX}_${test_name} SOURCES ${test_source} LIBS ${ARG_LIBS} LABELS ${ARG_LABELS})
  endforeach()
endfunction()

# fl_demo: what `./fl.sh demo` builds, the programs the quickstart (experiments/quickstart.yaml) starts and their
# libraries, nothing else: no test, no benchmark, no island runtime (issue 32 item 1). A newcomer's first run
# compiled every test too: 2,002 of its 3,719 compile-seconds were test executables. `./fl.sh test` builds `all`
# in the same build tree afterwards and so reuses every object this target made.
#
# The list is the programs fl-experiment runs for the quickstart (its runner: fl-server, then one fl-client per
# client or group) and fl-experiment itself; the userspace link relays run inside fl-experiment.
# experiments_demo_programs_test runs the quickstart from a folder holding only the programs of this target's
# dependency list, written at configure time into fl_demo_programs.txt from the target's own dependencies, so a
# program the quickstart needs that is not in the list fails it.
add_custom_target(fl_demo)
add_dependencies(fl_demo fl-experiment fl-server fl-client)

get_target_property(fl_demo_deps fl_demo MANUALLY_ADDED_DEPENDENCIES)
set(fl_demo_programs "")
foreach(fl_demo_dep IN LISTS fl_demo_deps)
  string(APPEND fl_demo_programs "$<TARGET_FILE:${fl_demo_dep}>\n")
endforeach()
set(FL_DEMO_PROGRAMS_FILE ${CMAKE_BINARY_DIR}/fl_demo_programs.txt)
file(GENERATE OUTPUT ${FL_DEMO_PROGRAMS_FILE} CONTENT "${fl_demo_programs}")

# Slow (a quickstart run of one short round with real training, ~10 s on two cores, more under load); it trains the
# LibTorch CNN, so only where LibTorch is built.
if(FL_WITH_TORCH AND FL_BUILD_TESTS)
  find_package(yaml-cpp CONFIG REQUIRED)
  fl_add_test(NAME experiments_demo_programs_test SOURCES ${PROJECT_SOURCE_DIR}/experiments/test/demo_programs_test.cc
              LIBS fl::testing yaml-cpp LABELS slow TIMEOUT 900)
  add_dependencies(experiments_demo_programs_test fl_demo)
  target_compile_definitions(experiments_demo_programs_test PRIVATE
    FL_DEMO_PROGRAMS_FILE="${FL_DEMO_PROGRAMS_FILE}" FL_EXPERIMENTS_DIR="${PROJECT_SOURCE_DIR}/experiments")
endif()

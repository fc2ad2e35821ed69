# Debian packages of the testbed (docs/packages.md): install() rules for the programs, the systemd units, a default
# configuration and the shared data, and CPack's DEB generator making one package per component:
#   fl-server  fl-server, fl-provision; fl-server.service; /etc/fl-testbed/fl-server.conf
#   fl-client  fl-client; fl-client@.service; /etc/fl-testbed/client-wlan0.conf (an example instance)
#   fl-tools   fl-experiment, fl-report, fl-link, the islands (fl-coordinator, fl-island, fl-islands-run); the link
#              and device profiles and the Grafana dashboards under /usr/share/fl-testbed
# Depends: computed by dpkg-shlibdeps from what each program links (Debian's runtime libraries: libgrpc++1.51,
# libtorch2.0, ...), so a package asks for exactly the libraries its programs load.
#
#   cmake --build build/release --target package-deb      (after building the programs) -> build/release/packages/
#   cmake --build build/arm64 --target package-deb        (the cross-built tree, FL_PACKAGE_COMPONENTS=client)
#
# The architecture is the target's (dpkg --print-architecture on a native build; arm64 for the aarch64 toolchain).
# A cross-built tree with a sysroot (tools/arm64-sysroot.sh) is packaged too: dpkg-shlibdeps then looks up the
# libraries in the sysroot and their packages in the dpkg database the script writes there (see below).
#
# FL_PACKAGE_COMPONENTS picks the packages (and so the programs package-deb builds): all three by default; the
# arm64 tree of docs/deploy-raspberry-pi.md sets it to client, the one program a board runs.
set(FL_PACKAGE_COMPONENTS "server;client;tools" CACHE STRING
    "The Debian packages package-deb makes: any of server, client, tools")
foreach(component IN LISTS FL_PACKAGE_COMPONENTS)
  if(NOT component MATCHES "^(server|client|tools)$")
    message(FATAL_ERROR "FL_PACKAGE_COMPONENTS=${FL_PACKAGE_COMPONENTS}: '${component}' is not a package; "
                        "use any of server, client, tools (separated by ;)")
  endif()
endforeach()

include(GNUInstallDirs)

# The programs of each package; a target this configuration does not build (FL_WITH_TORCH=OFF has no island
# runtime) is left out of its package.
set(FL_PACKAGE_PROGRAMS_server fl-server fl-provision)
set(FL_PACKAGE_PROGRAMS_client fl-client)
set(FL_PACKAGE_PROGRAMS_tools fl-experiment fl-report fl-link fl-coordinator fl-island fl-islands-run fl-privacy)
foreach(component server client tools)
  foreach(program IN LISTS FL_PACKAGE_PROGRAMS_${component})
    if(TARGET ${program})
      install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component})
    endif()
  endforeach()
endforeach()

# The units in deploy/systemd are written for a hand install into /usr/local/bin (docs/deploy.md); the packages
# install the programs into /usr/bin, so their copies say so.
foreach(unit fl-server.service fl-client@.service)
  file(READ "${PROJECT_SOURCE_DIR}/deploy/systemd/${unit}" unit_text)
  string(REPLACE "/usr/local/bin/" "/usr/bin/" unit_text "${unit_text}")
  file(WRITE "${PROJECT_BINARY_DIR}/packaging/systemd/${unit}" "${unit_text}")
endforeach()
install(FILES "${PROJECT_BINARY_DIR}/packaging/systemd/fl-server.service" DESTINATION lib/systemd/system
        COMPONENT server)
install(FILES "${PROJECT_BINARY_DIR}/packaging/systemd/fl-client@.service" DESTINATION lib/systemd/system
        COMPONENT client)
install(FILES "${PROJECT_SOURCE_DIR}/deploy/etc/fl-server.conf" DESTINATION /etc/fl-testbed COMPONENT server)
install(FILES "${PROJECT_SOURCE_DIR}/deploy/etc/client-wlan0.conf" DESTINATION /etc/fl-testbed COMPONENT client)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/experiments/profiles/" DESTINATION ${CMAKE_INSTALL_DATADIR}/fl-testbed/profiles
        COMPONENT tools)
install(FILES "${PROJECT_SOURCE_DIR}/dashboards/round-overview.json" "${PROJECT_SOURCE_DIR}/dashboards/straggler-analysis.json"
              "${PROJECT_SOURCE_DIR}/dashboards/links.json"
        DESTINATION ${CMAKE_INSTALL_DATADIR}/fl-testbed/dashboards COMPONENT tools)

# Debian's architecture name for the target.
if(CMAKE_CROSSCOMPILING)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
    set(FL_DEB_ARCH arm64)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|amd64)$")
    set(FL_DEB_ARCH amd64)
  else()
    set(FL_DEB_ARCH "${CMAKE_SYSTEM_PROCESSOR}")
  endif()
else()
  execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE FL_DEB_ARCH OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET)
  if(NOT FL_DEB_ARCH)
    set(FL_DEB_ARCH amd64)
  endif()
endif()

# The files under /etc are the administrator's: conffiles, kept on upgrade and removal (not purge). The maintainer
# scripts (deploy/debian) reload systemd after the unit is installed or removed.
file(WRITE "${PROJECT_BINARY_DIR}/packaging/server/conffiles" "/etc/fl-testbed/fl-server.conf\n")
file(WRITE "${PROJECT_BINARY_DIR}/packaging/client/conffiles" "/etc/fl-testbed/client-wlan0.conf\n")
foreach(component server client)
  foreach(script postinst postrm)
    file(COPY "${PROJECT_SOURCE_DIR}/deploy/debian/${script}" DESTINATION "${PROJECT_BINARY_DIR}/packaging/${component}"
         FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  endforeach()
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME fl-testbed)
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "fl-testbed maintainers <maintainers@fl-testbed.invalid>")
set(CPACK_PACKAGE_VENDOR "fl-testbed")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Federated / edge training testbed")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${FL_PACKAGE_COMPONENTS})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE "${FL_DEB_ARCH}")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)  # xz takes minutes for LibTorch-linked programs on two cores
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_SERVER_PACKAGE_NAME fl-server)
set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME fl-client)
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME fl-tools)
set(CPACK_COMPONENT_SERVER_DESCRIPTION
    "Federated-learning aggregator of the FL testbed\n fl-server admits clients over mutual TLS, runs rounds, aggregates model updates\n (FedAvg, FedAdam, FedBuff, ...) and records every phase of every round in SQLite; fl-provision issues\n the certificates. Start it with the fl-server systemd unit (docs/deploy.md).")
set(CPACK_COMPONENT_CLIENT_DESCRIPTION
    "Federated-learning edge client of the FL testbed\n fl-client trains with LibTorch on its local shard and reports what each phase cost it (downlink,\n train, eval, uplink). One systemd unit instance per client configuration: fl-client@<name>.")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "Experiment runner, report and link emulation of the FL testbed\n fl-experiment runs manifests with emulated links and devices, fl-report turns records into tables\n and plots, fl-link shapes links; the DiLoCo islands (fl-coordinator, fl-island).")
foreach(component server client)
  string(TOUPPER ${component} upper)
  set(CPACK_DEBIAN_${upper}_PACKAGE_CONTROL_EXTRA "${PROJECT_BINARY_DIR}/packaging/${component}/conffiles"
      "${PROJECT_BINARY_DIR}/packaging/${component}/postinst" "${PROJECT_BINARY_DIR}/packaging/${component}/postrm")
endforeach()
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# The datasets fl-client trains on by default, and what the units expect; OpenBLAS as the system BLAS, which
# LibTorch's nn.Linear and nn.GRU use (the reference BLAS, Debian's default, is 1.6-10x slower for them; see
# docs/performance.md, "TorchScript models"). The islands (fl-tools) train too.
set(CPACK_DEBIAN_CLIENT_PACKAGE_RECOMMENDS "dataset-fashion-mnist, libopenblas0-openmp")
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "libopenblas0-openmp")
set(CPACK_DEBIAN_SERVER_PACKAGE_SUGGESTS "prometheus, grafana")

# Cross-building with a sysroot: dpkg-shlibdeps must find the target's libraries in the sysroot (-l<dir>, CPack's
# private dirs), read them with the target's objdump (it picks aarch64-linux-gnu-objdump when DEB_HOST_ARCH is
# not the build machine's) and learn which package holds each of them from the sysroot's dpkg database
# (DPKG_ADMINDIR: status, info/<pkg>.list with the sysroot's paths, info/<pkg>.shlibs/.symbols), so that Depends
# names Debian's arm64 runtime packages, the same names as on amd64 (libtorch1.13, libgrpc++1.51, ...).
set(FL_PACKAGE_ENV)
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSROOT)
  set(FL_SYSROOT_DPKG "${CMAKE_SYSROOT}/.dpkg")
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${CMAKE_SYSROOT}/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}"
                                                  "${CMAKE_SYSROOT}/lib/${CMAKE_LIBRARY_ARCHITECTURE}")
  set(FL_PACKAGE_ENV "${CMAKE_COMMAND}" -E env "DPKG_ADMINDIR=${FL_SYSROOT_DPKG}" "DEB_HOST_ARCH=${FL_DEB_ARCH}")
endif()
include(CPack)

# One target that makes the packages after building what they hold.
set(FL_PACKAGED_TARGETS)
foreach(component IN LISTS FL_PACKAGE_COMPONENTS)
  foreach(program IN LISTS FL_PACKAGE_PROGRAMS_${component})
    if(TARGET ${program})
      list(APPEND FL_PACKAGED_TARGETS ${program})
    endif()
  endforeach()
endforeach()
set(FL_PACKAGE_CHECK)
if(FL_SYSROOT_DPKG)
  # Checked when the packages are made (the database may be written after configuring; building the programs does
  # not need it).
  file(WRITE "${PROJECT_BINARY_DIR}/packaging/check-sysroot-dpkg.sh"
       "test -f '${FL_SYSROOT_DPKG}/status' && exit 0\n"
       "echo 'package-deb: ${FL_SYSROOT_DPKG}/status is missing: dpkg-shlibdeps needs the dpkg database of the "
       "sysroot to name the ${FL_DEB_ARCH} packages in Depends. Run tools/arm64-sysroot.sh ${CMAKE_SYSROOT} (it "
       "writes the database), then package-deb again.' >&2\nexit 1\n")
  set(FL_PACKAGE_CHECK COMMAND sh "${PROJECT_BINARY_DIR}/packaging/check-sysroot-dpkg.sh")
endif()
add_custom_target(package-deb
  ${FL_PACKAGE_CHECK}
  COMMAND ${FL_PACKAGE_ENV} "${CMAKE_CPACK_COMMAND}" -G DEB --config "${PROJECT_BINARY_DIR}/CPackConfig.cmake"
  WORKING_DIRECTORY "${PROJECT_BINARY_DIR}"
  COMMENT "Debian packages (${FL_PACKAGE_COMPONENTS}, ${FL_DEB_ARCH}) into ${PROJECT_BINARY_DIR}/packages"
  USES_TERMINAL)
add_dependencies(package-deb ${FL_PACKAGED_TARGETS})

if(TARGET tools_packages_test)
  add_dependencies(tools_packages_test ${FL_PACKAGED_TARGETS})
  target_compile_definitions(tools_packages_test PRIVATE FL_CPACK="${CMAKE_CPACK_COMMAND}"
                             FL_BUILD_DIR="${PROJECT_BINARY_DIR}" FL_VERSION="${PROJECT_VERSION}")
endif()

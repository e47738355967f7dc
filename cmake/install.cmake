# What `cmake --install` puts where, and the Debian package (`cpack -G DEB`) made of it
# (docs/operations.md, "Install"). Paths follow GNUInstallDirs; the systemd units and the
# configuration name the installed paths of the prefix they are installed under.
#
#   bin/refitd, bin/refitctl
#   lib/<multiarch>/librefit_client.so            the C ABI, for bindings and C programs
#   lib/<multiarch>/refitd/libcudart.so.*, libnccl.so.*   CUDA builds: the runtime they were built with
#   include/refit/c_api.h
#   share/refitd/python/                          the `refit` package: pip install from there
#   share/refitd/models/*.yaml                    every model spec in deploy/models
#   share/refitd/deploy/                          Kubernetes, Prometheus and Grafana files
#   share/doc/refitd/                             README and docs/
#   lib/systemd/system/refitd.service, refitd@.service
#   etc/refitd/refitd.yaml, etc/refitd/models/demo-llama.yaml (/etc for the prefix /usr)
include(GNUInstallDirs)
# `make install` and cpack install what is built and build nothing first: a release tree builds
# just the installed targets (README, "Install"), and cpack on a built test tree stays fast.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)

install(TARGETS refitd refitctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS refit_client_c LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# A CUDA build carries the CUDA runtime and NCCL it was built with (NVIDIA redistributes both:
# the CUDA runtime under the CUDA EULA's redistributable files, NCCL under its BSD license) in a
# private directory, lib/<multiarch>/refitd/, found by the installed binaries' RUNPATH: a GPU node
# then needs only the NVIDIA driver (libcuda.so.1), not a CUDA toolkit (docs/operations.md
# "Install"). -DREFIT_BUNDLE_CUDA_RUNTIME=OFF leaves them out for a system that provides both.
option(REFIT_BUNDLE_CUDA_RUNTIME "Install the CUDA runtime and NCCL beside refitd (CUDA builds)" ON)
if(REFIT_CUDA AND REFIT_BUNDLE_CUDA_RUNTIME)
  set(refit_private_libdir ${CMAKE_INSTALL_LIBDIR}/refitd)
  set(refit_bundled)
  get_target_property(refit_cudart CUDA::cudart IMPORTED_LOCATION)
  if(NOT refit_cudart)
    find_library(refit_cudart cudart HINTS ${CUDAToolkit_LIBRARY_DIR} NO_CACHE)
  endif()
  list(APPEND refit_bundled ${refit_cudart})
  if(REFIT_NCCL_LIBRARY)
    list(APPEND refit_bundled ${REFIT_NCCL_LIBRARY})
  endif()
  foreach(lib IN LISTS refit_bundled)
    # Installed under the name the binaries ask for (their DT_NEEDED soname).
    file(REAL_PATH ${lib} real)
    execute_process(COMMAND readelf -d ${real} OUTPUT_VARIABLE dynamic)
    string(REGEX MATCH "\\(SONAME\\)[^[]*\\[([^]]+)\\]" _ "${dynamic}")
    if(NOT CMAKE_MATCH_1)
      message(FATAL_ERROR "refitd: no SONAME in ${real}, cannot bundle it")
    endif()
    install(FILES ${real} DESTINATION ${refit_private_libdir} RENAME ${CMAKE_MATCH_1})
  endforeach()
  file(RELATIVE_PATH refit_bin_to_private /${CMAKE_INSTALL_BINDIR} /${refit_private_libdir})
  set_target_properties(refitd refitctl PROPERTIES INSTALL_RPATH "$ORIGIN/${refit_bin_to_private}")
  set_target_properties(refit_client_c PROPERTIES INSTALL_RPATH "$ORIGIN/refitd")
endif()
install(FILES src/client/c_api.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/refit)
install(DIRECTORY python/ DESTINATION ${CMAKE_INSTALL_DATADIR}/refitd/python
  PATTERN __pycache__ EXCLUDE PATTERN "*.pyc" EXCLUDE PATTERN "*.egg-info" EXCLUDE PATTERN build EXCLUDE
  PATTERN lib EXCLUDE)
install(DIRECTORY deploy/models/ DESTINATION ${CMAKE_INSTALL_DATADIR}/refitd/models FILES_MATCHING PATTERN "*.yaml")
install(DIRECTORY deploy/kubernetes deploy/prometheus deploy/grafana DESTINATION ${CMAKE_INSTALL_DATADIR}/refitd/deploy)
file(GLOB refit_docs ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES README.md ${refit_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
# Units and configuration: rewritten at install time for the prefix then in effect.
install(CODE "set(REFIT_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
set(REFIT_STAGE_DIR \"${CMAKE_BINARY_DIR}/install-stage\")
set(REFIT_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
set(REFIT_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")")
install(SCRIPT cmake/install_deploy.cmake)

# The Debian package. Build it from a release tree (-DREFIT_TESTING=OFF): a package of a test
# build (failpoints compiled in) is refused unless REFIT_PACKAGE_TEST_BUILD=1 (tests/deploy only).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME refitd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR refitd)
set(CPACK_PACKAGE_CONTACT "refitd maintainers <refitd@example.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "weight refit daemon: moves RL trainer weights into running inference engines")
set(CPACK_PACKAGE_DESCRIPTION "refitd converts the weights RL trainers stream to it into the rollout checkpoint format
and swaps them into a running inference engine's memory in place. The package holds refitd, refitctl,
librefit_client.so and its C header, the refit Python package sources, model specs and systemd units.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# Stripped binaries (a RelWithDebInfo refitd is mostly debug info); zstd packs fast and dpkg 1.21
# (Debian 12) reads it.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE zstd)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.com/refitd")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# DESTDIR staging, so that the files under /etc land in the package and nowhere else.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
# Debian 12's runtime libraries of what refitd links (tests/deploy/test_install.py checks this
# list against ldd of the built binaries). A CUDA build carries its CUDA runtime and NCCL (above)
# and needs the driver.
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libc6, libstdc++6, libgcc-s1, libcapnp-0.9.2, libabsl20220623, libyaml-cpp0.7, libucx0, libssl3, adduser")
if(REFIT_CUDA)
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libcuda1")
endif()
configure_file(deploy/debian/conffiles ${CMAKE_BINARY_DIR}/debian/conffiles COPYONLY)
configure_file(deploy/debian/postinst ${CMAKE_BINARY_DIR}/debian/postinst COPYONLY)
configure_file(deploy/debian/triggers ${CMAKE_BINARY_DIR}/debian/triggers COPYONLY)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_BINARY_DIR}/debian/conffiles ${CMAKE_BINARY_DIR}/debian/postinst ${CMAKE_BINARY_DIR}/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(REFIT_PACKAGE_HAS_FAILPOINTS ${REFIT_FAILPOINTS})
configure_file(cmake/cpack_project_config.cmake.in ${CMAKE_BINARY_DIR}/cpack_project_config.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/cpack_project_config.cmake)
include(CPack)

# Install-time part of cmake/install.cmake: the systemd units and the configuration, with the
# paths of the prefix being installed to (CMAKE_INSTALL_PREFIX as `cmake --install --prefix` or
# cpack set it). The configuration goes to /etc for the prefix /usr (as GNUInstallDirs does),
# to PREFIX/etc otherwise; an existing configuration is kept (the package marks it conffiles).
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
else()
  set(etc "${prefix}/etc")
endif()
set(replacements
  "/usr/local/bin/refitd" "${prefix}/${REFIT_BINDIR}/refitd"
  "/usr/local/share/doc/refitd" "${prefix}/${REFIT_DOCDIR}"
  "/etc/refitd" "${etc}/refitd")

function(refit_install_rewritten src dest_dir)
  file(READ "${REFIT_SOURCE_DIR}/${src}" text)
  set(r ${replacements})
  while(r)
    list(POP_FRONT r from to)
    string(REPLACE "${from}" "${to}" text "${text}")
  endwhile()
  get_filename_component(name "${src}" NAME)
  file(WRITE "${REFIT_STAGE_DIR}/${name}" "${text}")
  file(INSTALL DESTINATION "${dest_dir}" TYPE FILE FILES "${REFIT_STAGE_DIR}/${name}")
endfunction()

refit_install_rewritten(deploy/systemd/refitd.service "${prefix}/lib/systemd/system")
refit_install_rewritten(deploy/systemd/refitd@.service "${prefix}/lib/systemd/system")
foreach(config deploy/systemd/refitd.yaml deploy/models/demo-llama.yaml)
  if(config MATCHES "models/")
    set(dest "${etc}/refitd/models")
  else()
    set(dest "${etc}/refitd")
  endif()
  get_filename_component(name "${config}" NAME)
  if(EXISTS "$ENV{DESTDIR}${dest}/${name}")
    message(STATUS "Keeping: $ENV{DESTDIR}${dest}/${name}")
  else()
    refit_install_rewritten(${config} "${dest}")
  endif()
endforeach()

# Installation: the shared and static libraries, the header, a CMake package
# (find_package(syncbn) -> syncbn::syncbn, syncbn::syncbn_static) and pkg-config modules
# (syncbn: the shared library; syncbn-static: the static one).
# tests/install/ is a consumer project that .ci/run builds against an installed copy.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SYNCBN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/syncbn)

install(TARGETS syncbn syncbn_static
  EXPORT syncbnTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/syncbn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# the license goes with the binaries (Apache-2.0, section 4)
# (share/doc/syncbn whatever project included GNUInstallDirs first: CMAKE_INSTALL_DOCDIR
# names that project's folder, where its own LICENSE goes)
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/syncbn)

install(EXPORT syncbnTargets
  NAMESPACE syncbn::
  FILE syncbnTargets.cmake
  DESTINATION ${SYNCBN_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/syncbnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/syncbnConfig.cmake
  INSTALL_DESTINATION ${SYNCBN_CMAKE_DIR})
# 0.x: a minor release may change the API (semantic versioning), so only the same
# major.minor satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/syncbnConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/syncbnConfig.cmake ${PROJECT_BINARY_DIR}/syncbnConfigVersion.cmake
  DESTINATION ${SYNCBN_CMAKE_DIR})

# pkg-config: prefix is found relative to the .pc file, so `cmake --install --prefix DIR`
# gives a working file wherever DIR is.
file(RELATIVE_PATH SYNCBN_PC_TO_PREFIX
  ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" SYNCBN_PC_TO_PREFIX "${SYNCBN_PC_TO_PREFIX}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(SYNCBN_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(SYNCBN_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SYNCBN_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(SYNCBN_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
# The static library's own dependencies: Libs.private of syncbn.pc (pkg-config --static)
# and Libs of syncbn-static.pc. All static or the system's: the CUDA runtime is linked in
# (libcudart_static.a, which needs -ldl -lrt -lpthread after it) and NCCL is loaded at run
# time, so the programs start without libcudart, libnccl or a driver.
set(SYNCBN_PC_DEPS "-lpthread -lm -ldl")
if(SYNCBN_HAVE_CUDA)
  set(SYNCBN_PC_DEPS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -lrt ${SYNCBN_PC_DEPS}")
endif()
set(SYNCBN_PC_STATIC_LIB ${CMAKE_STATIC_LIBRARY_PREFIX}syncbn${CMAKE_STATIC_LIBRARY_SUFFIX})
configure_file(${CMAKE_CURRENT_LIST_DIR}/syncbn.pc.in ${PROJECT_BINARY_DIR}/syncbn.pc @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/syncbn-static.pc.in ${PROJECT_BINARY_DIR}/syncbn-static.pc
  @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/syncbn.pc ${PROJECT_BINARY_DIR}/syncbn-static.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Install rules: headers as <prefix>/include/fastlearn/<folder>/<name>.h, the library, the `fastlearn`
# CLI (when built), and a CMake package: find_package(fastlearn) + target_link_libraries(app
# fastlearn::fastlearn) in another project, which finds LibTorch the way this build does.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FASTLEARN_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/fastlearn")

install(FILES fastlearn.h DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fastlearn")
# The public headers only: what only fastlearn's own files use lives in <folder>/detail/ and is not installed.
foreach(folder core launch comm data optim models learner callbacks distributed config c)
  install(DIRECTORY "${folder}/" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fastlearn/${folder}"
          FILES_MATCHING PATTERN "*.h" PATTERN "detail" EXCLUDE)
endforeach()

# Installed, the library and the CLI carry no debug info: 27 MiB against 420 MB as built (split DWARF's
# skeletons and gdb index). FASTLEARN_INSTALL_DEBUG_INFO=ON installs them as built.
option(FASTLEARN_INSTALL_DEBUG_INFO "Install the library and the CLI with their debug info" OFF)
function(fastlearn_strip_installed target destination)
  if(FASTLEARN_INSTALL_DEBUG_INFO OR NOT CMAKE_STRIP)
    return()
  endif()
  install(CODE "execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug
                  \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${destination}/$<TARGET_FILE_NAME:${target}>\"
                  COMMAND_ERROR_IS_FATAL ANY)")
endfunction()

install(TARGETS fastlearn EXPORT fastlearnTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
fastlearn_strip_installed(fastlearn "${CMAKE_INSTALL_LIBDIR}")
# The Fortran module: compiled (fastlearn.mod, for the gfortran it was built with) with its library, and its source.
install(FILES c/fastlearn.f90 DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fastlearn/c")
if(TARGET fastlearn_fortran)
  install(TARGETS fastlearn_fortran EXPORT fastlearnTargets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
  install(FILES "${FASTLEARN_FORTRAN_MODULES}/fastlearn.mod" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/fastlearn/fortran")
endif()
install(EXPORT fastlearnTargets NAMESPACE fastlearn:: DESTINATION "${FASTLEARN_CMAKE_DIR}")

# The LibTorch the library was built with: the package config looks there first, and insists on its version.
get_filename_component(_fastlearn_torch_dir "${Torch_DIR}" ABSOLUTE)
set(FASTLEARN_BUILT_TORCH_VERSION "${Torch_VERSION}")
set(FASTLEARN_BUILT_TORCH_DIR "${_fastlearn_torch_dir}")
configure_package_config_file(cmake/fastlearnConfig.cmake.in "${PROJECT_BINARY_DIR}/fastlearnConfig.cmake"
                              INSTALL_DESTINATION "${FASTLEARN_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/fastlearnConfigVersion.cmake"
                                 VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/fastlearnConfig.cmake" "${PROJECT_BINARY_DIR}/fastlearnConfigVersion.cmake"
              cmake/FastlearnTorch.cmake cmake/FastlearnCsv.cmake
        DESTINATION "${FASTLEARN_CMAKE_DIR}")

# libcsv (Debian's libcsv-dev ships neither a CMake package nor a pkg-config file): the imported target
# fastlearn::csv. Included by fastlearn's build and by its installed package.
if(NOT TARGET fastlearn::csv)
  find_path(FASTLEARN_CSV_INCLUDE_DIR csv.h)
  find_library(FASTLEARN_CSV_LIBRARY csv)
  if(NOT FASTLEARN_CSV_INCLUDE_DIR OR NOT FASTLEARN_CSV_LIBRARY)
    message(FATAL_ERROR "libcsv not found (csv.h and libcsv): install libcsv-dev (scripts/bootstrap does)")
  endif()
  add_library(fastlearn::csv UNKNOWN IMPORTED GLOBAL)
  set_target_properties(fastlearn::csv PROPERTIES IMPORTED_LOCATION "${FASTLEARN_CSV_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${FASTLEARN_CSV_INCLUDE_DIR}")
endif()

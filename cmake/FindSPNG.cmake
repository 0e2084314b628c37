# SPDX-License-Identifier: Apache-2.0
# libspng (Debian: libspng-dev), which ships a pkg-config file but no CMake package. stoker's
# build and find_package(stoker) of a static build use this module, installed beside
# stokerConfig.cmake.
#
# Defines SPNG_FOUND, SPNG_INCLUDE_DIR, SPNG_LIBRARY and the imported target SPNG::SPNG.
find_path(SPNG_INCLUDE_DIR spng.h DOC "Directory holding libspng's spng.h")
find_library(SPNG_LIBRARY spng DOC "libspng")
mark_as_advanced(SPNG_INCLUDE_DIR SPNG_LIBRARY)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SPNG REQUIRED_VARS SPNG_LIBRARY SPNG_INCLUDE_DIR)

if(SPNG_FOUND AND NOT TARGET SPNG::SPNG)
  add_library(SPNG::SPNG UNKNOWN IMPORTED)
  set_target_properties(SPNG::SPNG PROPERTIES IMPORTED_LOCATION "${SPNG_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${SPNG_INCLUDE_DIR}")
endif()

# SPDX-License-Identifier: Apache-2.0
# stoker's components and their installed package: the libraries, their headers, the CMake
# package (find_package(stoker COMPONENTS ...)), stoker.pc for pkg-config, and the generated
# headers stoker/version.h and stoker/config.h.
#
# A component is one folder and one library: `stoker_component(name sources...)` in the
# folder's CMakeLists.txt is all it takes to build it, install it with its headers, export it
# as stoker::name, make it a component of find_package(stoker) with the components and
# packages it links, and put it in stoker::stoker and stoker.pc. stoker_package(), called once
# at the end of the top level, writes the package.

include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(STOKER_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/stoker)
set(STOKER_GENERATED_DIR ${PROJECT_BINARY_DIR}/generated)

# The package that provides each namespace of imported targets a component may link, as
# find_dependency takes it, and by the package's name its pkg-config module for a static
# stoker.pc (empty: nothing to link; undefined: a static stoker.pc cannot name it, and the
# configure says so). A component that links a
# target of a namespace missing here stops the configure: the installed package would
# reference a target that nothing finds.
set(STOKER_PACKAGE_Threads "Threads")
set(STOKER_PKGCONFIG_Threads "")  # -pthread, in stoker.pc's flags
set(STOKER_PACKAGE_dlpack "dlpack")
set(STOKER_PKGCONFIG_dlpack "")
set(STOKER_PACKAGE_TBB "TBB")
set(STOKER_PKGCONFIG_TBB "tbb")
set(STOKER_PACKAGE_spdlog "spdlog")
set(STOKER_PKGCONFIG_spdlog "spdlog")
set(STOKER_PACKAGE_nlohmann_json "nlohmann_json")
set(STOKER_PKGCONFIG_nlohmann_json "nlohmann_json")
set(STOKER_PACKAGE_libjpeg-turbo "libjpeg-turbo")
set(STOKER_PKGCONFIG_libjpeg-turbo "libjpeg libturbojpeg")
set(STOKER_PACKAGE_SPNG "SPNG")  # cmake/FindSPNG.cmake
set(STOKER_PKGCONFIG_SPNG "spng")
set(STOKER_PACKAGE_ZLIB "ZLIB")
set(STOKER_PKGCONFIG_ZLIB "zlib")
set(STOKER_PACKAGE_CURL "CURL")
set(STOKER_PKGCONFIG_CURL "libcurl")
set(STOKER_PACKAGE_CUDA "CUDAToolkit")
set(STOKER_PACKAGE_MPI "MPI COMPONENTS CXX")
set(STOKER_PKGCONFIG_MPI "ompi-cxx")

function(stoker_component name)
  add_library(stoker_${name} ${STOKER_LIBRARY_TYPE} ${ARGN})
  add_library(stoker::${name} ALIAS stoker_${name})
  # Installed side by side, the libraries find each other through $ORIGIN.
  set_target_properties(stoker_${name} PROPERTIES EXPORT_NAME ${name} OUTPUT_NAME stoker_${name}
                        INSTALL_RPATH "$ORIGIN" VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  target_include_directories(stoker_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${STOKER_GENERATED_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(stoker_${name} PRIVATE $<BUILD_INTERFACE:stoker_warnings>)
  install(TARGETS stoker_${name} EXPORT stoker-${name}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
  set_property(GLOBAL APPEND PROPERTY STOKER_COMPONENTS ${name})
endfunction()

# What component `name`'s installed target references: the stoker components (out_components)
# and the find_dependency arguments of the packages (out_packages), from the link interface it
# exports (a static library's private links included, as $<LINK_ONLY:...>).
function(stoker_component_links name out_components out_packages)
  get_target_property(links stoker_${name} INTERFACE_LINK_LIBRARIES)
  if(NOT links)
    set(links "")
  endif()
  set(components "")
  set(packages "")
  foreach(link IN LISTS links)
    # What only the build tree sees, and the wrapper of a static library's private links.
    string(REGEX REPLACE "\\$<BUILD_INTERFACE:[^>]*>" "" link "${link}")
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" link "${link}")
    if(link STREQUAL "")
      continue()
    endif()
    if(link MATCHES "^stoker(::|_)([A-Za-z0-9_]+)$")
      list(APPEND components ${CMAKE_MATCH_2})
      continue()
    endif()
    string(REGEX MATCH "^[A-Za-z0-9_-]+::" namespace "${link}")
    string(REPLACE "::" "" namespace "${namespace}")
    if(namespace AND DEFINED STOKER_PACKAGE_${namespace})
      list(APPEND packages "${STOKER_PACKAGE_${namespace}}")
    else()
      message(FATAL_ERROR "stoker_${name} links '${link}': add the package that provides it to "
                          "cmake/StokerPackage.cmake (STOKER_PACKAGE_<namespace>), so that "
                          "find_package(stoker) finds it for the user")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES components)
  list(REMOVE_DUPLICATES packages)
  set(${out_components} "${components}" PARENT_SCOPE)
  set(${out_packages} "${packages}" PARENT_SCOPE)
endfunction()

# stoker/version.h and stoker/config.h, for the build tree and the install.
function(stoker_generate_headers)
  set(feature_defines "")
  set(feature_summary "")
  set(feature_cmake "")
  foreach(feature IN LISTS STOKER_FEATURES)
    if(STOKER_HAVE_${feature})
      set(value 1)
      set(word yes)
    else()
      set(value 0)
      set(word no)
    endif()
    string(APPEND feature_defines "#define STOKER_HAS_${feature} ${value}\n")
    list(APPEND feature_summary "${feature} ${word}")
    string(APPEND feature_cmake "set(stoker_HAS_${feature} ${value})\n")
  endforeach()
  list(JOIN feature_summary ", " STOKER_FEATURE_SUMMARY)
  set(STOKER_FEATURE_DEFINES "${feature_defines}")
  set(STOKER_FEATURE_CMAKE "${feature_cmake}" PARENT_SCOPE)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in ${STOKER_GENERATED_DIR}/include/stoker/version.h @ONLY)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/config.h.in ${STOKER_GENERATED_DIR}/include/stoker/config.h @ONLY)
  install(FILES ${STOKER_GENERATED_DIR}/include/stoker/version.h ${STOKER_GENERATED_DIR}/include/stoker/config.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/stoker)
endfunction()

# stoker.pc: every component, as stoker::stoker has them.
function(stoker_generate_pkgconfig components packages)
  set(pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
  # Relative to the .pc file, so that the install prefix can move.
  file(RELATIVE_PATH to_prefix ${CMAKE_INSTALL_PREFIX}/${pc_dir} ${CMAKE_INSTALL_PREFIX})
  string(REGEX REPLACE "/$" "" to_prefix "${to_prefix}")
  set(libs "")
  foreach(c IN LISTS components)
    string(PREPEND libs "-lstoker_${c} ")  # a library before the ones it uses, for static links
  endforeach()
  # Header-only dependencies outside the compiler's own search path.
  set(cflags "")
  foreach(target dlpack::dlpack)
    if(TARGET ${target})
      get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
      foreach(dir IN LISTS dirs)
        if(dir AND NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
          string(APPEND cflags " -I${dir}")
        endif()
      endforeach()
    endif()
  endforeach()
  set(requires_private "")
  if(NOT STOKER_SHARED)
    foreach(package IN LISTS packages)
      string(REGEX REPLACE " .*" "" package "${package}")
      if(NOT DEFINED STOKER_PKGCONFIG_${package})
        message(WARNING "stoker.pc of a static build cannot name ${package}'s libraries: link with CMake "
                        "(find_package(stoker)) or add them yourself")
      elseif(STOKER_PKGCONFIG_${package})
        list(APPEND requires_private ${STOKER_PKGCONFIG_${package}})
      endif()
    endforeach()
    list(REMOVE_DUPLICATES requires_private)
  endif()
  # Shared libraries: a program linked with these flags finds them at run time wherever the
  # install is, without LD_LIBRARY_PATH (the install's lib/ is its RUNPATH).
  set(rpath "")
  if(STOKER_SHARED)
    set(rpath [[-Wl,-rpath,${libdir} ]])
  endif()
  list(JOIN requires_private " " requires_private)
  if(requires_private)
    set(requires_private "Requires.private: ${requires_private}\n")
  endif()
  file(CONFIGURE OUTPUT ${STOKER_GENERATED_DIR}/stoker.pc @ONLY CONTENT [[
prefix=${pcfiledir}/@to_prefix@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@

Name: stoker
Description: @PROJECT_DESCRIPTION@
Version: @PROJECT_VERSION@
License: @STOKER_LICENSE@
@requires_private@Cflags: -I${includedir}@cflags@ -pthread
Libs: -L${libdir} @rpath@@libs@-pthread
]])
  install(FILES ${STOKER_GENERATED_DIR}/stoker.pc DESTINATION ${pc_dir})
endfunction()

# The installed package. Call once, at the end of the top level, after every component.
function(stoker_package)
  get_property(components GLOBAL PROPERTY STOKER_COMPONENTS)

  # Everything in one: link stoker::stoker, include "stoker/stoker.h".
  add_library(stoker INTERFACE)
  add_library(stoker::stoker ALIAS stoker)
  foreach(c IN LISTS components)
    target_link_libraries(stoker INTERFACE stoker::${c})
  endforeach()
  target_include_directories(stoker INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  install(TARGETS stoker EXPORT stoker-targets)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT stoker-targets NAMESPACE stoker:: DESTINATION ${STOKER_CMAKE_INSTALL_DIR})

  # Per component, in build order: what it needs, then its targets. A component's needs come
  # before it, so that loading in this order imports every target before it is referenced.
  set(STOKER_COMPONENT_REQUIRES "")
  set(STOKER_COMPONENT_LOADERS "")
  set(all_packages "")
  set(seen "")
  foreach(c IN LISTS components)
    install(EXPORT stoker-${c}-targets NAMESPACE stoker:: DESTINATION ${STOKER_CMAKE_INSTALL_DIR})
    stoker_component_links(${c} needs packages)
    foreach(need IN LISTS needs)
      if(NOT need IN_LIST seen)
        message(FATAL_ERROR "stoker component '${c}' links '${need}', which is not a component made before it")
      endif()
    endforeach()
    list(APPEND seen ${c})
    list(APPEND all_packages ${packages})
    string(APPEND STOKER_COMPONENT_REQUIRES "set(_stoker_requires_${c} ${needs})\n")
    string(APPEND STOKER_COMPONENT_LOADERS "if(\"${c}\" IN_LIST _stoker_load)\n")
    foreach(package IN LISTS packages)
      string(APPEND STOKER_COMPONENT_LOADERS "  find_dependency(${package})\n")
    endforeach()
    string(APPEND STOKER_COMPONENT_LOADERS
           "  include(\"\${CMAKE_CURRENT_LIST_DIR}/stoker-${c}-targets.cmake\")\n"
           "  set(stoker_${c}_FOUND TRUE)\n"
           "endif()\n")
  endforeach()
  list(REMOVE_DUPLICATES all_packages)
  set(STOKER_COMPONENT_NAMES "${components}")

  stoker_generate_headers()
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/stokerConfig.cmake.in
    ${STOKER_GENERATED_DIR}/stokerConfig.cmake
    INSTALL_DESTINATION ${STOKER_CMAKE_INSTALL_DIR})
  write_basic_package_version_file(${STOKER_GENERATED_DIR}/stokerConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  install(FILES ${STOKER_GENERATED_DIR}/stokerConfig.cmake ${STOKER_GENERATED_DIR}/stokerConfigVersion.cmake
                ${PROJECT_SOURCE_DIR}/cmake/FindSPNG.cmake
          DESTINATION ${STOKER_CMAKE_INSTALL_DIR})
  stoker_generate_pkgconfig("${components}" "${all_packages}")
  # The docs the programs' --help points to (apps::doc_page), beside the license.
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs DESTINATION ${CMAKE_INSTALL_DOCDIR})
endfunction()

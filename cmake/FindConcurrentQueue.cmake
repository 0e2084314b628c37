# SPDX-License-Identifier: Apache-2.0
# moodycamel's ConcurrentQueue, a header-only library that ships no CMake package of its own in
# Debian (libconcurrentqueue-dev). stoker's public headers include
# <concurrentqueue/concurrentqueue.h>, so stoker's build and find_package(stoker) both use this
# module, installed beside stokerConfig.cmake.
#
# Defines ConcurrentQueue_FOUND, ConcurrentQueue_INCLUDE_DIR (the directory holding
# concurrentqueue/) and the imported target ConcurrentQueue::ConcurrentQueue, unless a project
# defined that target already. Set ConcurrentQueue_INCLUDE_DIR to use another copy.
find_path(ConcurrentQueue_INCLUDE_DIR concurrentqueue/concurrentqueue.h
          DOC "Directory holding moodycamel's concurrentqueue/concurrentqueue.h")
mark_as_advanced(ConcurrentQueue_INCLUDE_DIR)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ConcurrentQueue REQUIRED_VARS ConcurrentQueue_INCLUDE_DIR)

if(ConcurrentQueue_FOUND AND NOT TARGET ConcurrentQueue::ConcurrentQueue)
  add_library(ConcurrentQueue::ConcurrentQueue INTERFACE IMPORTED)
  set_target_properties(ConcurrentQueue::ConcurrentQueue PROPERTIES
                        INTERFACE_INCLUDE_DIRECTORIES "${ConcurrentQueue_INCLUDE_DIR}")
endif()

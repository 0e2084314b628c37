# SPDX-License-Identifier: Apache-2.0
# stoker-inspect's reading of a log, its verdict, reports and plots: a library of its own, so that
# the program and the tests (tests/inspect, built in every build, the apps' or not) share it. It
# needs only nlohmann-json, not the stoker libraries.
if(NOT TARGET stoker_inspect_model)
  set(dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(stoker_inspect_model STATIC ${dir}/log.cpp ${dir}/verdict.cpp ${dir}/vocabulary.cpp ${dir}/report.cpp
                                          ${dir}/plot.cpp ${dir}/job.cpp)
  target_include_directories(stoker_inspect_model PUBLIC ${dir} ${dir}/../common)
  target_link_libraries(stoker_inspect_model PUBLIC nlohmann_json::nlohmann_json PRIVATE stoker_warnings)
endif()

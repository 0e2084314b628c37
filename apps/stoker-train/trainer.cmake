# SPDX-License-Identifier: Apache-2.0
# The trainer itself (train.cpp and what it trains with): a library of its own, so that the
# program and the tests (tests/train, built in every build, the apps' or not) compile it once.
if(NOT TARGET stoker_trainer)
  set(dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(stoker_trainer STATIC ${dir}/train.cpp ${dir}/mlp.cpp ${dir}/checkpoint.cpp ${dir}/images.cpp)
  target_include_directories(stoker_trainer PUBLIC ${dir})
  target_link_libraries(stoker_trainer PUBLIC stoker::stoker stoker_nn PRIVATE nlohmann_json::nlohmann_json stoker_warnings)
endif()

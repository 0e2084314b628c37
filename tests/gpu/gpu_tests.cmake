# SPDX-License-Identifier: Apache-2.0
# The device layer (test_gpu) and the kernels (test_augment: crops, and resized crops of
# images), each case on every backend: the CUDA halves skip at run time without a GPU. They hold streams back and spin on the device
# with a few test kernels (stream_tools_cuda.cu), which a build without CUDA replaces by stubs.
if(STOKER_HAVE_CUDA)
  add_library(stoker_gpu_test_tools OBJECT gpu/stream_tools.cpp gpu/stream_tools_cuda.cu)
  # Its objects need the CUDA runtime at link time; the tests that use them include no CUDA header.
  target_link_libraries(stoker_gpu_test_tools PRIVATE CUDA::cudart INTERFACE $<LINK_ONLY:CUDA::cudart>)
  # The target inherits C++20, for which CMake 3.25 knows no nvcc flag; the .cu needs C++17.
  set_target_properties(stoker_gpu_test_tools PROPERTIES CUDA_STANDARD 17)
else()
  add_library(stoker_gpu_test_tools OBJECT gpu/stream_tools.cpp gpu/stream_tools_nocuda.cpp)
endif()
target_link_libraries(stoker_gpu_test_tools PUBLIC stoker::gpu doctest::doctest PRIVATE stoker_warnings)
target_include_directories(stoker_gpu_test_tools PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})  # tests/cuda_cases.h

stoker_test(test_gpu gpu/test_device.cpp)
target_link_libraries(test_gpu PRIVATE stoker_gpu_test_tools)
stoker_test(test_augment gpu/test_augment.cpp gpu/test_image_augment.cpp)
target_link_libraries(test_augment PRIVATE stoker_gpu_test_tools)
target_include_directories(test_augment PRIVATE ${PROJECT_SOURCE_DIR}/gpu/src)  # the kernels' own entry point

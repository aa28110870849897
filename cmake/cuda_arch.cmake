# The CUDA architectures syncbn's kernels are built for, when the user did not say
# (CMAKE_CUDA_ARCHITECTURES on the command line or in the cache, or the CUDAARCHS
# environment variable, both CMake's own):
#
#   - GPUs visible at configure time (nvidia-smi): machine code (SASS) for each of their
#     architectures from sm_80 on, and nothing else: "90-real" on an H100 or H200. This is
#     what a build on the machine that runs it wants; the GPU suite and the benchmarks
#     build so.
#   - no GPU visible (a build machine, CI): PTX for compute_80 only ("80-virtual"). The
#     driver compiles it for whatever GPU runs it (sm_80 and later: A100, H100, H200,
#     B200) when a team is first created on it, about a minute per machine, and keeps the
#     result in its cache (~/.nv/ComputeCache). ptxas does not run, which halves the
#     build; scripts/check-sass.sh builds and checks the machine code for sm_80, sm_90
#     and sm_100 in CI (sm_80 and sm_100 assembled from that PTX). To ship machine code from such a machine, say which, e.g.
#     -DCMAKE_CUDA_ARCHITECTURES="80-real;90-real;100" (SASS for A100, H100/H200 and
#     B200, plus compute_100 PTX for later GPUs).
#
# The kernels need sm_80 or later (cp.async, the L2 cache hints); an older GPU is left
# out of the list (teams on it are refused at init: "no kernel image").
function(syncbn_default_cuda_architectures)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(how "as given")
  elseif(NOT "$ENV{CUDAARCHS}" STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "$ENV{CUDAARCHS}")
    set(how "from CUDAARCHS")
  else()
    set(found "")
    find_program(SYNCBN_NVIDIA_SMI nvidia-smi)
    mark_as_advanced(SYNCBN_NVIDIA_SMI)
    if(SYNCBN_NVIDIA_SMI)
      execute_process(COMMAND "${SYNCBN_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE caps ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 30)
      if(rc EQUAL 0)
        string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${caps}")
        foreach(cap IN LISTS caps)
          string(REPLACE "." "" arch "${cap}")
          if(arch GREATER_EQUAL 80)
            list(APPEND found "${arch}-real")
          else()
            message(STATUS "syncbn: GPU of compute capability ${cap} left out (syncbn needs 8.0 or later)")
          endif()
        endforeach()
        list(REMOVE_DUPLICATES found)
        list(SORT found COMPARE NATURAL)
      endif()
    endif()
    if(found)
      set(CMAKE_CUDA_ARCHITECTURES "${found}")
      set(how "the GPUs of this machine (nvidia-smi); set CMAKE_CUDA_ARCHITECTURES for others")
    else()
      set(CMAKE_CUDA_ARCHITECTURES "80-virtual")
      set(how "no GPU visible: PTX that the driver compiles at first use; set CMAKE_CUDA_ARCHITECTURES for machine code")
    endif()
  endif()
  message(STATUS "syncbn: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (${how})")
  set(CMAKE_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" PARENT_SCOPE)
endfunction()

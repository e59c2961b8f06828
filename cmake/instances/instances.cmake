# Compile time only: the class templates that kvlab's own tests, tutorials and programs nearly all
# instantiate, compiled once per build instead of once per translation unit (see
# kvlab_instances.hpp). Not part of the library: nothing here is installed, and a target that
# does not use it builds and behaves the same, only more slowly.
#
# kvlab_use_instances(<target> <instances library>): <target> gets kvlab_instances.hpp
# force-included ahead of its sources and links the library. The library must be compiled with
# the target's own options (kvlab_add_instances), or the target would run code compiled with
# other flags. GCC and Clang only (-include); elsewhere, or with KVLAB_SHARED_INSTANCES off, it
# does nothing.
#
# kvlab_add_instances(<name> [FLOAT_ONLY] [options...]): the instances in float and double, or
# (FLOAT_ONLY) in float alone, compiled with `options`.
function(kvlab_add_instances name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "FLOAT_ONLY" "" "")
  set(sources "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances_float.cpp")
  if(NOT arg_FLOAT_ONLY)
    list(APPEND sources "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances_double.cpp")
  endif()
  add_library(${name} STATIC ${sources})
  target_link_libraries(${name} PRIVATE kvlab::kvlab kvlab_warnings)
  target_compile_options(${name} PRIVATE ${arg_UNPARSED_ARGUMENTS})
endfunction()

function(kvlab_use_instances target library)
  if(KVLAB_SHARED_INSTANCES AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE
      "SHELL:-include ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances.hpp")
    target_link_libraries(${target} PRIVATE ${library})
  endif()
endfunction()

# kvlab_use_program_instances(<target> [options...]): for kvlab's programs (apps/, bench/), which
# are compiled with `options` (kvlab_bench_options: -O3 -march=native): the classes compiled once
# with those same options (kvlab_program_instances, made on first use), so that each program
# compiles only its own code (kvlab-generate: 15 s instead of 42 s on a Zen 3 core). Stores
# are called through the KVStore interface, so nothing that could be inlined into a program's
# loops moves out of it. The programs compute in float only, so their instances hold float alone
# (the double half took 29 s of CPU to compile at -O3 and nothing used it; a program that used a
# double store would fail to link, naming the class). Without options the programs use the
# build's own instances.
function(kvlab_use_program_instances target)
  if(NOT KVLAB_SHARED_INSTANCES)
    return()
  endif()
  if(NOT ARGN)
    if(TARGET kvlab_instances)
      kvlab_use_instances(${target} kvlab_instances)
    endif()
    return()
  endif()
  if(NOT TARGET kvlab_program_instances)
    kvlab_add_instances(kvlab_program_instances FLOAT_ONLY ${ARGN})
  endif()
  kvlab_use_instances(${target} kvlab_program_instances)
endfunction()

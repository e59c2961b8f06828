# Compile time only: the class templates that kvlab's own tests, tutorials and programs nearly all
# instantiate, compiled once per build instead of once per translation unit (see
# kvlab_instances.hpp). Not part of the library: nothing here is installed, and a target that
# does not use it builds and behaves the same, only more slowly.
#
# kvlab_use_instances(<target> <instances library>): <target> gets kvlab_instances.hpp
# force-included ahead of its sources and links the library. The library must be compiled with
# the target's own options (kvlab_add_instances), or the target would run code compiled with
# other flags. GCC and Clang only (-include); elsewhere it does nothing.
function(kvlab_add_instances name)
  add_library(${name} STATIC "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances_float.cpp"
                             "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances_double.cpp")
  target_link_libraries(${name} PRIVATE kvlab::kvlab kvlab_warnings)
  target_compile_options(${name} PRIVATE ${ARGN})
endfunction()

function(kvlab_use_instances target library)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE
      "SHELL:-include ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/kvlab_instances.hpp")
    target_link_libraries(${target} PRIVATE ${library})
  endif()
endfunction()

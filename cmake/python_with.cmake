# kvlab_python_with(<module> <out-var>): sets <out-var> to the first of CMake's Python and
# /usr/bin/python3 that imports <module> (Debian's python3-selenium and python3-matplotlib are
# for the system's python3, which need not be the one CMake found), or to "" when none does.
function(kvlab_python_with module out)
  set(found "")
  foreach(python IN ITEMS "${Python3_EXECUTABLE}" /usr/bin/python3)
    if(python)
      execute_process(COMMAND "${python}" -c "import ${module}" RESULT_VARIABLE missing
                      OUTPUT_QUIET ERROR_QUIET)
      if(missing EQUAL 0)
        set(found "${python}")
        break()
      endif()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

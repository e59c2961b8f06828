# Runs PROGRAM and writes its standard output to OUTPUT; fails if the program fails, so the
# docs never embed the output of a broken run.
get_filename_component(dir "${OUTPUT}" DIRECTORY)
file(MAKE_DIRECTORY "${dir}")
execute_process(COMMAND "${PROGRAM}" OUTPUT_FILE "${OUTPUT}.tmp" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  file(REMOVE "${OUTPUT}.tmp")
  message(FATAL_ERROR "${PROGRAM} exited with ${result}")
endif()
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")

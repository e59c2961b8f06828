# Runs PROGRAM and writes its standard output to OUTPUT; fails if the program fails, so the
# docs never embed the output of a broken run (77, a program that could not run for want of a file,
# is kept: its output says why).
get_filename_component(dir "${OUTPUT}" DIRECTORY)
file(MAKE_DIRECTORY "${dir}")
execute_process(COMMAND "${PROGRAM}" OUTPUT_FILE "${OUTPUT}.tmp" RESULT_VARIABLE result)
# 77: the program says it could not run (a model file it needs is absent) and why: that line is
# what the docs show.
if(NOT result EQUAL 0 AND NOT result EQUAL 77)
  file(REMOVE "${OUTPUT}.tmp")
  message(FATAL_ERROR "${PROGRAM} exited with ${result}")
endif()
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")

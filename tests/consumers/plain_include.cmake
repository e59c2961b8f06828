# Builds and runs a program with nothing but a compiler, `-I include` and Eigen's include
# directory: the header-only way to use kvlab. Run with cmake -P (see tests/CMakeLists.txt).
file(MAKE_DIRECTORY "${WORK_DIR}")
set(exe "${WORK_DIR}/quickstart")
execute_process(
  COMMAND "${CXX}" -std=c++17 -Wall -Wextra -I "${INCLUDE_DIR}" -isystem "${EIGEN_DIR}" "${SOURCE}" -o "${exe}"
  RESULT_VARIABLE compile_result)
if(NOT compile_result EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with -I ${INCLUDE_DIR} failed (${compile_result})")
endif()
execute_process(COMMAND "${exe}" RESULT_VARIABLE run_result)
if(NOT run_result EQUAL 0)
  message(FATAL_ERROR "${exe} exited with ${run_result}")
endif()

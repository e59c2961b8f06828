# kvlab_cli_tests(<target> <option> <bad value> <expected>): two CTests of a program's command
# line (declared with CLI11, support/cli.hpp), label `cli`:
#   <target>_help        --help prints the generated help, which lists <option>, and exits 0;
#   <target>_bad_option  <option> <bad value> is refused with exit status 2 and the message
#                        "<option>: expected <expected>, got '<bad value>' (try --help)", before
#                        anything runs.
# <expected> is a regular expression. After them, PROGRAM <name>: the name the usage line shows,
# where the program's file is not named as its target (the tutorials: tutorial_01_naive_attention
# makes 01_naive_attention).
function(kvlab_cli_tests target option bad expected)
  cmake_parse_arguments(PARSE_ARGV 4 arg "" "PROGRAM" "")
  set(program "${target}")
  if(arg_PROGRAM)
    set(program "${arg_PROGRAM}")
  endif()
  set(run "out=$(\"$0\" \"$@\" 2>&1); rc=$?; printf '%s\\nexit %s\\n' \"$out\" \"$rc\"")
  add_test(NAME ${target}_help COMMAND sh -c "${run}" $<TARGET_FILE:${target}> --help)
  set_tests_properties(${target}_help PROPERTIES LABELS cli TIMEOUT 60
    PASS_REGULAR_EXPRESSION "Usage: [^\n]*${program}[^\n]* \\[OPTIONS\\].*\n  ${option} [^\n]*.*\nexit 0\n")
  add_test(NAME ${target}_bad_option COMMAND sh -c "${run}" $<TARGET_FILE:${target}> ${option} ${bad})
  string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" bad_regex "${bad}")
  set_tests_properties(${target}_bad_option PROPERTIES LABELS cli TIMEOUT 60
    PASS_REGULAR_EXPRESSION "${option}: expected ${expected}, got '${bad_regex}' \\(try --help\\)\nexit 2\n")
endfunction()

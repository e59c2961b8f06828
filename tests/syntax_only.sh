#!/bin/sh
# The header check's compiler launcher (tests/CMakeLists.txt): runs the compile command it is
# given ("$@") with -fsyntax-only — every template instantiated and every warning checked, no code
# generated, which is most of the time of header_check_instantiations.cpp — and then creates the
# (empty) object file that the command's -o names, so that the build sees the step done.
"$@" -fsyntax-only || exit
out=
previous=
for argument in "$@"; do
  if [ "$previous" = "-o" ]; then out=$argument; fi
  previous=$argument
done
if [ -n "$out" ]; then : > "$out"; fi

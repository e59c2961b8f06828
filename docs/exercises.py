#!/usr/bin/env python3
"""Runs every exercise of the tutorials' pages and fails when an answer no longer holds.

A tutorial's page ends with a section "## Exercises". Each exercise in it gives one command in a
fenced block (```sh, one line, the program named from the repository root: build/tutorials/...
or build/apps/...), asks the reader to predict what it prints, and folds the answer into a
<details> block. The answer quotes, as an indented code block, the lines the command prints that
settle the prediction. This runs each command (with build/ read as the build folder given) and
checks that each quoted line occurs in a line of its output, so an answer cannot go stale: a
change in what a program prints fails the docs build until the page is updated.

It fails, too, on a page with fewer than --minimum exercises, an exercise whose command is not
one line or names no program of the build, an answer that quotes nothing, or one whose first
line is blank (Doxygen would end the <details> block there and show the answer unfolded). A command that
exits 77 (a tutorial whose file is absent: the real model) is reported as skipped, not failed.

usage: exercises.py --build-dir build --source-dir . --stamp FILE PAGE.md [PAGE.md ...]
"""
import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

SKIPPED = 77
FENCE = re.compile(r"^```sh\n(.*?)^```\n", re.M | re.S)
DETAILS = re.compile(r"<details>(.*?)</details>", re.S)


def exercises(page):
    """The exercises of a page: [(command, [quoted lines], line number)], one per <details>
    block of its "## Exercises" section, each with the last ```sh block before it."""
    text = page.read_text(encoding="utf-8")
    start = text.find("\n## Exercises")
    if start < 0:
        return []
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    found, position = [], 0
    for details in DETAILS.finditer(section):
        commands = list(FENCE.finditer(section, position, details.start()))
        command = commands[-1].group(1) if commands else ""
        quoted = [line[4:].rstrip() for line in details.group(1).splitlines()
                  if line.startswith("    ") and line.strip()]
        line = text.count("\n", 0, start + details.start()) + 1
        # Doxygen (1.9) ends the block at a blank line right after its summary: the answer would
        # show outside it, unfolded, under an empty "Answer"
        if re.search(r"</summary>[ \t]*\n[ \t]*\n", details.group(1)):
            quoted = None
        found.append((command, quoted, line))
        position = details.end()
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--source-dir", type=Path, required=True)
    parser.add_argument("--stamp", type=Path, required=True, help="written when all pass")
    parser.add_argument("--minimum", type=int, default=2, help="exercises each page must have")
    parser.add_argument("pages", type=Path, nargs="+")
    args = parser.parse_args()
    problems, ran, skipped = [], 0, 0
    for page in args.pages:
        found = exercises(page)
        if len(found) < args.minimum:
            problems.append(f"{page.name}: {len(found)} exercise(s) in its '## Exercises' section, "
                            f"fewer than {args.minimum}")
        for number, (command, quoted, line) in enumerate(found, 1):
            where = f"{page.name}:{line}: exercise {number}"
            words = shlex.split(command.strip()) if command.strip() else []
            if len(command.strip().splitlines()) != 1 or not words:
                problems.append(f"{where}: expected one command line in a ```sh block before its "
                                f"answer, got {command.strip()!r}")
                continue
            if not words[0].startswith("build/"):
                problems.append(f"{where}: expected a program of the build (build/...), got "
                                f"'{words[0]}'")
                continue
            if quoted is None:
                problems.append(f"{where}: a blank line follows its </summary>, where Doxygen "
                                "ends the <details> block: start the answer on the next line")
                continue
            if not quoted:
                problems.append(f"{where}: its answer quotes no output (an indented block)")
                continue
            program = args.build_dir / words[0][len("build/"):]
            try:
                run = subprocess.run([str(program)] + words[1:], cwd=args.source_dir,
                                     capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.TimeoutExpired) as e:
                problems.append(f"{where}: '{command.strip()}' did not run: {e}")
                continue
            if run.returncode == SKIPPED:
                skipped += 1
                print(f"exercises.py: {where}: skipped ('{command.strip()}' exited 77: "
                      f"{run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ''})")
                continue
            ran += 1
            if run.returncode != 0:
                problems.append(f"{where}: '{command.strip()}' exited {run.returncode}: "
                                f"{(run.stderr or run.stdout).strip()[-300:]}")
                continue
            lines = [l.rstrip() for l in run.stdout.splitlines()]
            for want in quoted:
                if not any(want.strip() and want in l for l in lines):
                    problems.append(f"{where}: '{command.strip()}' no longer prints the line its "
                                    f"answer quotes: '{want}'")
    for problem in problems:
        print(f"exercises.py: {problem}", file=sys.stderr)
    if problems:
        print(f"exercises.py: FAILED, {len(problems)} problem(s); update the answers (or the "
              "programs) so that each quoted line is what the command prints", file=sys.stderr)
        return 1
    print(f"exercises.py: {ran} exercise(s) of {len(args.pages)} page(s) ran, each answer found in "
          f"its output; {skipped} skipped")
    args.stamp.write_text(f"{ran} ran, {skipped} skipped\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

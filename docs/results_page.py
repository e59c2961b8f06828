#!/usr/bin/env python3
"""Writes the Benchmarks page's list of committed results, and fails when it would be incomplete.

bench/results/README.md describes the committed results in one table, between two lines holding
`[files]` (HTML comments there, so that they do not show where the file is read as Markdown).
Each row names one or more files in backticks and says what made them and where. This writes
that table again with every file a link into the site's copy of the folder (`results/NAME`), for
docs/pages/benchmarks.md to include (`\\includedoc`), and exits non-zero when the table names a
file that is not in the folder, or when a file of the folder is in no row: a result committed
without a description fails the docs build instead of missing from the site.

usage: results_page.py --results bench/results --out FILE.md
"""
import argparse
import re
import sys
from pathlib import Path

MARKER = "[files]"
NAME = re.compile(r"`([A-Za-z0-9_.-]+\.(?:txt|json|md|svg|csv|log))`")


def table_rows(readme):
    """The table's rows (the lines between the two marker lines that start with '|'), the
    header and its rule first."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    marks = [i for i, line in enumerate(lines) if MARKER in line]
    if len(marks) != 2:
        sys.exit(f"results_page.py: {readme}: expected 2 lines holding '{MARKER}' around the "
                 f"table of files, found {len(marks)}")
    return [line for line in lines[marks[0] + 1:marks[1]] if line.startswith("|")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, required=True, help="the folder of results")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table to write")
    args = parser.parse_args()
    readme = args.results / "README.md"
    rows = table_rows(readme)
    present = {p.name for p in args.results.iterdir() if p.is_file()}
    named, problems, out = {"README.md"}, [], []
    out += rows[:2]  # the header and the rule under it
    for row in rows[2:]:
        cells = row.strip().strip("|").split("|", 1)
        names = NAME.findall(cells[0])
        if len(cells) != 2 or not names:
            problems.append(f"a row that names no file in backticks in its first cell: {row}")
            continue
        what = cells[1]
        for name in names:
            if name not in present:
                problems.append(f"the table names {name}, which is not in {args.results}")
            named.add(name)
        # (an HTML link: Doxygen would read a Markdown link to a .md file as a \\ref to a page)
        links = ", ".join(f'<a href="results/{n}">{n}</a>' for n in names)
        out.append(f"| {links} | {what.strip()} |")
    problems += [f"{name} is in {args.results} but in no row of the table in {readme}: say "
                 "what made it (program, machine) there" for name in sorted(present - named)]
    if problems:
        sys.exit("results_page.py: " + "\nresults_page.py: ".join(problems))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(out) + "\n"
    if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

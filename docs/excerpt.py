#!/usr/bin/env python3
"""Copies the lines of a program's captured output from the first line that starts with FROM up
to (not including) the first later line that starts with TO, for a page that shows one part of
it (the landing page: tutorial 10's chat). An output without FROM (a tutorial that was not run:
"Not run: ...") is copied whole, so the page says why.

usage: excerpt.py IN OUT --from TEXT --to TEXT
"""
import argparse


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--from", dest="start", required=True)
    parser.add_argument("--to", dest="stop", required=True)
    args = parser.parse_args()
    with open(args.input, encoding="utf-8") as f:
        lines = f.read().splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(args.start)), None)
    if first is None:
        part = lines
    else:
        last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith(args.stop)),
                    len(lines))
        part = lines[first:last]
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("\n".join(part) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Fails the docs build when a generated file no longer says what a page's text says about it.

A page may describe a picture drawn at build time in words ("in step 12, request 5 joins with 8
tokens from the prefix cache"). This checks that the file the picture is drawn from still holds
each of those facts, so that a change in what the program does cannot leave the words stale.

usage: expect_text.py FILE --page PAGE TEXT [TEXT ...]   (each TEXT must occur in FILE verbatim)
"""
import argparse
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file")
    parser.add_argument("--page", required=True, help="the page whose text quotes FILE")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    with open(args.file, encoding="utf-8") as f:
        content = f.read()
    missing = [t for t in args.texts if t not in content]
    if missing:
        sys.exit("expect_text.py: {} no longer contains what {} says about it:\n  {}\n"
                 "Update the page's text (and this list in tutorials/CMakeLists.txt) to what the "
                 "program now does.".format(args.file, args.page, "\n  ".join(missing)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The bad-input table's check: every public function and constructor of kvlab that takes an
argument has a row in entry_points.txt, and the rows say the truth about test_bad_input.

The public names come from the headers themselves, through Doxygen's XML (run here, XML only):
every public member function of the classes and structs in namespace kvlab, and every function
of the namespace, that takes at least one argument (a function without one has no input to get
wrong). Left out, and said so on the generated page: namespace kvlab::cuda (its host API runs
kernels; tests/cuda checks its arguments on a GPU or the emulator), deleted functions, and the
implementation namespace kvlab::detail (Doxygen does not list it).

Each row of entry_points.txt is `signature | status`, the signature as Doxygen writes it
(`kvlab::BlockAllocator::allocate(int n)`), the status one of
  tested              test_bad_input runs at least one case for it;
  none: <reason>      no argument value is wrong (the reason says why);
  unchecked: <reason> not checked on purpose (a hot path's accessor: the reason says what
                      checks its arguments instead);
  todo                not done yet (counted, listed on the page).
The check fails on a public function with no row, a row for a function that is not public, a
`tested` row without a case, a case for a function whose row is not `tested`, or a failing
test_bad_input. It prints the counts; with --page it writes the docs page: every function
against the input classes tried, with the number of cases of each.

usage: check_table.py --doxygen DOXYGEN --include DIR --table entry_points.txt
                      --test TEST_BAD_INPUT [--page OUT.md] [--skeleton]
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def public_functions(doxygen, include):
    """{signature: header} for every public function of kvlab that takes an argument."""
    with tempfile.TemporaryDirectory() as out:
        config = "\n".join([
            f"INPUT = {include}", "FILE_PATTERNS = *.hpp *.cuh", "RECURSIVE = YES",
            "EXTRACT_ALL = YES", "EXTRACT_PRIVATE = NO", "EXTRACT_STATIC = YES",
            "EXCLUDE_SYMBOLS = detail kvlab::detail", "GENERATE_HTML = NO",
            "GENERATE_LATEX = NO", "GENERATE_XML = YES", "XML_PROGRAMLISTING = NO",
            f"OUTPUT_DIRECTORY = {out}", "QUIET = YES", "WARNINGS = NO", "HAVE_DOT = NO",
            "ENABLE_PREPROCESSING = YES", "MACRO_EXPANSION = NO"])
        subprocess.run([doxygen, "-"], input=config, text=True, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        compounds = []
        for path in glob.glob(os.path.join(out, "xml", "*.xml")):
            if os.path.basename(path) != "index.xml":
                compounds += ET.parse(path).getroot().findall("compounddef")
        # Classes declared in a private or protected section (a loader's file cursor) are not
        # public API, whatever their own members' access: they and what they enclose are left out.
        hidden = {inner.text for c in compounds for inner in c.findall("innerclass")
                  if inner.get("prot") != "public"}
        found = {}
        for compound in compounds:
            if compound.get("kind") not in ("class", "struct", "namespace"):
                continue
            scope = compound.findtext("compoundname")
            if not (scope == "kvlab" or scope.startswith("kvlab::")):
                continue
            if any(scope == h or scope.startswith(h + "::") for h in hidden):
                continue
            if scope == "kvlab::cuda" or scope.startswith("kvlab::cuda::"):
                continue
            for member in compound.iter("memberdef"):
                if member.get("kind") != "function" or member.get("prot") != "public":
                    continue
                args = " ".join((member.findtext("argsstring") or "").split())
                if args.startswith("()") or "=delete" in args.replace(" ", ""):
                    continue
                header = member.find("location").get("file")
                if "/kvlab/cuda/" in header or header.endswith(".cuh"):
                    continue
                found[f"{scope}::{member.findtext('name')}{args}"] = header
        return found


def read_table(path):
    rows, errors = {}, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            if " | " not in line:
                errors.append(f"{path}:{number}: expected 'signature | status', got '{line}'")
                continue
            signature, status = (part.strip() for part in line.rsplit(" | ", 1))
            if not (status in ("tested", "todo") or re.match(r"(none|unchecked): \S", status)):
                errors.append(f"{path}:{number}: status must be tested, todo, 'none: <reason>' or "
                              f"'unchecked: <reason>', got '{status}'")
            if signature in rows:
                errors.append(f"{path}:{number}: '{signature}' has two rows")
            rows[signature] = status
    return rows, errors


def run_cases(test):
    """{signature: {input class: cases}} from one run of test_bad_input, which must pass."""
    with tempfile.TemporaryDirectory() as out:
        table = os.path.join(out, "cases.tsv")
        result = subprocess.run([test], env=dict(os.environ, KVLAB_BAD_INPUT_TABLE=table,
                                                 OMP_NUM_THREADS="1"),
                                text=True, capture_output=True)
        if result.returncode != 0:
            sys.stdout.write(result.stdout[-4000:] + result.stderr[-2000:])
            raise SystemExit(f"{test} failed (exit code {result.returncode})")
        cases = collections.defaultdict(dict)
        with open(table, encoding="utf-8") as f:
            for line in f:
                signature, kind, count = line.rstrip("\n").split("\t")
                cases[signature][kind] = int(count)
        return cases


def write_page(path, public, rows, cases):
    kinds = sorted({k for c in cases.values() for k in c})
    tested = sorted(s for s in public if rows.get(s) == "tested")
    none = sorted(s for s in public if rows.get(s, "").startswith("none:"))
    unchecked = sorted(s for s in public if rows.get(s, "").startswith("unchecked:"))
    todo = sorted(s for s in public if rows.get(s) == "todo")
    total = sum(sum(c.values()) for c in cases.values())
    out = ["# Bad input, by entry point {#bad_input_table}", "",
           "Every public function and constructor of kvlab that takes an argument, from the "
           "headers (Doxygen's list, checked by the test `bad_input_table`: a new public name "
           "without a row fails), and what the test program `test_bad_input` (one file per "
           "folder, `tests/<folder>/test_<folder>_bad_input.cpp`) tries on it. Each case "
           "asserts kvlab's exception type, a message naming the argument with the expected and "
           "the actual value, and the object's observable state unchanged, compared before and "
           "after. Generated from the test's own run at build time.", "",
           f"**{len(public)} entry points with arguments: {len(tested)} tested ({total} cases), "
           f"{len(none)} with no wrong value, {len(unchecked)} unchecked on purpose, "
           f"{len(todo)} not done yet.** Left out: the CUDA host "
           "API (namespace `kvlab::cuda`, checked by tests/cuda on a GPU or the emulator) and "
           "functions without arguments.", "",
           "| entry point | " + " | ".join(kinds) + " | cases |",
           "|---|" + "---|" * (len(kinds) + 1)]
    for s in tested:
        counts = cases.get(s, {})
        cells = [str(counts[k]) if k in counts else "" for k in kinds]
        out.append(f"| `{s}` | " + " | ".join(cells) + f" | {sum(counts.values())} |")
    out += ["", "## No wrong value", "", "| entry point | why |", "|---|---|"]
    out += [f"| `{s}` | {rows[s][len('none: '):]} |" for s in none]
    out += ["", "## Unchecked on purpose", "", "| entry point | why |", "|---|---|"]
    out += [f"| `{s}` | {rows[s][len('unchecked: '):]} |" for s in unchecked]
    out += ["", "## Not done yet", ""]
    out += [f"- `{s}`" for s in todo]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--doxygen", required=True)
    p.add_argument("--include", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--test")
    p.add_argument("--page")
    p.add_argument("--skeleton", action="store_true",
                   help="print a row for every public function (status todo) and stop")
    args = p.parse_args()
    public = public_functions(args.doxygen, args.include)
    if args.skeleton:
        for s in sorted(public):
            print(f"{s} | todo")
        return
    rows, errors = read_table(args.table)
    for s in sorted(set(public) - set(rows)):
        errors.append(f"{s} ({os.path.relpath(public[s], args.include)}) is public and has no "
                      f"row in {args.table}")
    for s in sorted(set(rows) - set(public)):
        errors.append(f"{args.table}: '{s}' is not a public function with arguments")
    cases = run_cases(args.test) if args.test else {}
    for s in sorted(rows):
        if rows[s] == "tested" and s not in cases:
            errors.append(f"{args.table}: '{s}' is marked tested, and test_bad_input ran no case")
    for s in sorted(cases):
        if rows.get(s) != "tested":
            errors.append(f"test_bad_input runs cases for '{s}', whose row is not 'tested'")
    if errors:
        print("\n".join(errors))
        raise SystemExit(1)
    status = collections.Counter(r.split(":")[0] for s, r in rows.items())
    total = sum(sum(c.values()) for c in cases.values())
    print(f"{len(public)} entry points with arguments: {status['tested']} tested ({total} cases), "
          f"{status['none']} with no wrong value, {status['unchecked']} unchecked on purpose, "
          f"{status['todo']} not done yet")
    if args.page:
        write_page(args.page, public, rows, cases)


if __name__ == "__main__":
    main()

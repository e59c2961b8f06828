#!/usr/bin/env python3
"""Runs a program under gdb with a command file and writes the debugger's side of the session.

The command file sets trace-commands, so gdb echoes each command with a leading '+'. The
transcript keeps those commands, the breakpoints hit, the source lines where the program stopped
and the printed values; the program's own output is left out (its tutorial page shows it), and
paths under --source-dir are written relative to it. The command file's '# expect: ' lines say
what the session must show, each a line of the form 'print X => value' (a command and the value
it printed) or 'at line N: text' (a stop at line N, whose source starts with text). Fails unless
gdb's program exits normally and every expectation holds, so the docs never show a session that
stopped somewhere else, e.g. after the kernel's lines moved and the command file's breakpoint
did not.

Without gdb (--gdb is not an executable, e.g. CMake's GDB-NOTFOUND), or where gdb may not trace
a program (ptrace refused, as in some containers), it prints SKIPPED and exits with 77 (CTest:
skipped); with --skip-note it writes a line saying so to OUT instead, for the docs.

usage: run_session.py --gdb GDB --script FILE.gdb --program PROGRAM --source-dir DIR --output OUT
                      [--skip-note]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys


def skip(args, why):
    """Reports the session as not run: SKIPPED and exit 77, or with --skip-note a note in OUT."""
    if not args.skip_note:
        print(f"SKIPPED: {why}")
        sys.exit(77)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(f"(Not run when these docs were built: {why}; the debugger session was not "
                "recorded.)\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--gdb", "--script", "--program", "--source-dir", "--output"):
        parser.add_argument(name, required=True)
    parser.add_argument("--skip-note", action="store_true")
    args = parser.parse_args()

    if shutil.which(args.gdb) is None:
        skip(args, f"gdb is not installed ('{args.gdb}' is not a program)")
        return

    with open(args.script, encoding="utf-8") as f:
        expected = [line[len("# expect: "):].strip() for line in f if line.startswith("# expect: ")]
    # LeakSanitizer cannot work under a debugger (it stops the program with an error), so a
    # program built with AddressSanitizer runs here without it; other programs ignore the setting.
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), "detect_leaks=0"]))
    try:
        run = subprocess.run([args.gdb, "-nx", "-batch", "-x", args.script, args.program],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=300, check=False, env=env)
    except subprocess.TimeoutExpired:
        sys.exit(f"run_session.py: gdb -batch -x {args.script} {args.program} did not end "
                 "within 300 s")
    out = run.stdout.replace(args.source_dir.rstrip("/") + "/", "")
    if "ptrace: Operation not permitted" in out:  # e.g. a container without the capability
        skip(args, "gdb may not trace programs here (ptrace: Operation not permitted)")
        return
    if run.returncode != 0 or "exited normally" not in out:
        sys.exit(f"run_session.py: gdb -batch -x {args.script} {args.program}: exit "
                 f"{run.returncode}; the program did not exit normally:\n{out}")

    transcript = []  # the lines shown in the docs
    seen = []        # 'print X => value' and 'at line N: text', for the expectations
    command = None   # the last command echoed
    for line in out.splitlines():
        if line.startswith("+"):
            command = line[1:].strip()
        elif re.match(r"\$[0-9]+ = ", line):
            if command is not None:
                seen.append(f"{command} => {line.split(' = ', 1)[1]}")
        elif re.match(r"[0-9]+\t", line):
            number, text = line.split("\t", 1)
            seen.append(f"at line {number}: {text.strip()}")
        elif line.startswith("Breakpoint "):
            # "Breakpoint 1 at 0x2cb94: file:line. (12 locations)": the address depends on the
            # build, so the docs show the rest
            line = re.sub(r" at 0x[0-9a-f]+:", ":", line)
        elif re.match(r'Thread [0-9]+ "[^"]*" hit Breakpoint ', line):
            # a stop, in a program with threads: 'Thread 1 "name" hit Breakpoint 1.8, f (a=...) at
            # file:line'
            line = line[line.index("hit Breakpoint ") + len("hit "):]
        else:
            continue
        transcript.append(line)

    missing = [e for e in expected
               if not any(s == e or (e.startswith("at line ") and s.startswith(e)) for s in seen)]
    if missing:
        sys.exit("run_session.py: the session of {} lacks:\n  {}\nIts breakpoint may no longer be "
                 "on the line it expects. What it showed:\n{}".format(
                     args.script, "\n  ".join(missing), "\n".join(transcript)))
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("\n".join(transcript) + "\n")


if __name__ == "__main__":
    main()

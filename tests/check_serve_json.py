#!/usr/bin/env python3
"""Checks the files kvlab-serve writes with --json and --step-log (kvlab/report/run_json.hpp) for
a run of apps/examples/workload.jsonl: both parse as JSON; the run holds every request of the
workload, in order, under the workload's own ids, each with its prompt and at most
max_new_tokens output ids; the step log holds one object per step of the run.

    check_serve_json.py WORKLOAD RUN_JSON STEP_LOG
"""
import json
import sys


def main():
    workload_path, run_path, log_path = sys.argv[1:4]
    requests = [json.loads(line) for line in open(workload_path) if line.strip()]
    with open(run_path) as f:
        run = json.load(f)
    with open(log_path) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    problems = []
    if run["requests"] != len(requests):
        problems.append(f"requests: expected {len(requests)}, got {run['requests']}")
    outputs = run["outputs"]
    if len(outputs) != len(requests):
        problems.append(f"outputs: expected {len(requests)}, got {len(outputs)}")
    for i, (want, got) in enumerate(zip(requests, outputs)):
        if got["id"] != want.get("id", i):
            problems.append(f"outputs[{i}].id: expected {want.get('id', i)!r}, got {got['id']!r}")
        if got["prompt"] != want["prompt"]:
            problems.append(f"outputs[{i}].prompt: expected {want['prompt']}, got {got['prompt']}")
        if not 1 <= len(got["output"]) <= want.get("max_new_tokens", 16):
            problems.append(f"outputs[{i}].output: expected 1 to max_new_tokens ids, "
                            f"got {len(got['output'])}")
    if len(steps) != run["steps"]:
        problems.append(f"step log: expected {run['steps']} lines (the run's steps), got {len(steps)}")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"ok: {len(outputs)} requests, {len(steps)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

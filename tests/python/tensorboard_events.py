"""Reads the event files in a log directory with TensorBoard's own reader and compares the scalars.

usage: tensorboard_events.py LOG_DIR EXPECTED.json [CORRUPT_DIR]
EXPECTED.json: {"<tag>": [[step, value], ...], ...}; every tag must be present with exactly these steps,
and values equal once rounded to float32 (TensorBoard's simple_value). CORRUPT_DIR holds the same file
with a byte changed: the reader must not return the expected scalars from it (it checks the CRCs).
Prints OK or the differences.
"""
import json
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator


def differences(log_dir, expected):
    acc = event_accumulator.EventAccumulator(log_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    problems = []
    if tags != sorted(expected):
        problems.append(f"tags {tags} != {sorted(expected)}")
    for tag, points in expected.items():
        if tag not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(int(s), float(np.float32(v))) for s, v in points]
        if [s for s, _ in got] != [s for s, _ in want]:
            problems.append(f"{tag}: steps {[s for s, _ in got]} != {[s for s, _ in want]}")
            continue
        for (step, g), (_, w) in zip(got, want):
            if g != w:
                problems.append(f"{tag} at step {step}: {g!r} != {w!r}")
    return problems


def main():
    with open(sys.argv[2]) as f:
        expected = json.load(f)
    problems = differences(sys.argv[1], expected)
    if len(sys.argv) > 3:
        try:
            read_anyway = not differences(sys.argv[3], expected)
        except Exception:  # the reader may also give up on the file
            read_anyway = False
        if read_anyway:
            problems.append(f"the corrupted copy in {sys.argv[3]} was read as if it were intact")
    for p in problems:
        print(p)
    if not problems:
        print("OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Interop checks of fastlearn's safetensors files against the reference Python implementation.

    safetensors_interop.py write PATH   writes reference() and METADATA with safetensors.torch.save_file
    safetensors_interop.py check PATH   loads PATH with safetensors.torch.load_file and compares it exactly

tests/core/safetensors_test.cpp builds the same tensors with the same torch ops; keep the two in step.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

METADATA = {"format": "pt", "epoch": "3", "note": "f\u00fcr \u2713"}


def reference():
    base = torch.arange(24, dtype=torch.float64)
    f32 = (base.float() / 3 - 2).reshape(4, 6)
    return {
        "f64": (base / 7 - 1.5).reshape(2, 3, 4),
        "f32": f32,
        "f32_t": f32.t(),
        "f16": (base / 5 - 2).half(),
        "bf16": (base / 9 + 0.25).bfloat16().reshape(6, 4),
        "i64": (base.long() * 1000000007 - 3).reshape(3, 8),
        "i32": (base.int() * 65537 - 9).reshape(8, 3),
        "i16": (base.short() * 1111 - 7000).reshape(2, 12),
        "i8": (base.to(torch.int8) * 5 - 60).reshape(4, 3, 2),
        "u8": (base.to(torch.uint8) * 10).reshape(12, 2),
        "bool": (base.long() % 3 == 0).reshape(2, 12),
        "scalar": torch.tensor(3.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }


def main():
    command, path = sys.argv[1], sys.argv[2]
    expected = reference()
    if command == "write":
        save_file({k: v.contiguous() for k, v in expected.items()}, path, metadata=METADATA)
        return 0
    loaded = load_file(path)
    problems = []
    if sorted(loaded) != sorted(expected):
        problems.append(f"names {sorted(loaded)} != {sorted(expected)}")
    for name, want in expected.items():
        got = loaded.get(name)
        if got is None:
            continue
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            problems.append(f"{name}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:8].tolist()}, "
                            f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:8].tolist()}")
    with safe_open(path, framework="pt") as f:
        if f.metadata() != METADATA:
            problems.append(f"metadata {f.metadata()} != {METADATA}")
    for p in problems:
        print(p)
    if not problems:
        print("OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

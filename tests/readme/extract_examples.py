#!/usr/bin/env python3
"""Writes the C++ examples of README.md as programs, so that the suite builds and runs them as written.

  extract_examples.py README.md OUT_DIR

quick_start.cpp  the first ```cpp block (a whole program)
distributed.cpp  the same program with its fit line replaced by the second block (the DistribCtx scope)
data.cpp         the third block (includes, then statements), its statements wrapped in main()
images.cpp       the fourth block, the same way
tables.cpp       the fifth block, the same way
"""
import pathlib
import re
import sys


def blocks(text):
    return [m.group(1) for m in re.finditer(r"```cpp\n(.*?)```", text, re.S)]


def main():
    readme, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    found = blocks(readme.read_text(encoding="utf-8"))
    if len(found) < 5:
        sys.exit(f"{readme}: expected at least 5 ```cpp blocks (quick start, distributed, data, images, tables), "
                 f"found {len(found)}")
    quick, distributed, data, images, tables = found[:5]
    fit_lines = [line for line in quick.splitlines() if "learn.fit_one_cycle(" in line]
    if len(fit_lines) != 1:
        sys.exit(f"{readme}: the first ```cpp block must have exactly one learn.fit_one_cycle( line")
    header = "// Extracted from README.md by tests/readme/extract_examples.py; edit README.md instead.\n"
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "quick_start.cpp": quick,
        "distributed.cpp": quick.replace(fit_lines[0] + "\n", distributed),
    }
    for name, block in (("data.cpp", data), ("images.cpp", images), ("tables.cpp", tables)):
        top = [l for l in block.splitlines() if l.startswith("#include") or l.startswith("namespace ")]
        body = [l for l in block.splitlines() if l not in top]
        files[name] = "\n".join(top) + "\n\nint main() {\n" + "\n".join("  " + l for l in body) + "\n}\n"
    for name, code in files.items():
        path = out / name
        text = header + code
        if not path.exists() or path.read_text(encoding="utf-8") != text:  # unchanged: no rebuild
            path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

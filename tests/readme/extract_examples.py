#!/usr/bin/env python3
"""Writes the C++ examples of README.md and of the guides in docs/ as programs, so that the suite builds and runs
them as written.

  extract_examples.py README.md DOCS_DIR OUT_DIR GUIDE...

README.md:
  quick_start.cpp    the first ```cpp block (a whole program)
  distributed.cpp    the same program with its fit line replaced by the second block (the DistribCtx scope)
Each GUIDE (docs/GUIDE.md), one program for the whole page, guide_GUIDE.cpp:
  every ```cpp block of the page, in order, each the body of a function that main() calls in turn (a block's local
  names stay its own); the blocks' #include lines and namespace aliases go to the top of the file, once each. A
  block is statements, and the types it needs (a callback, a dataset) are classes defined inside it.
A guide with a ```c, ```fortran, ```toml or ```python block (at most one of each: a whole program, a whole config) also
gets guide_GUIDE.c, guide_GUIDE.f90, guide_GUIDE.toml or guide_GUIDE.py, as written.
"""
import pathlib
import re
import sys

HEADER = "// Extracted by tests/readme/extract_examples.py; edit {} instead.\n"


def blocks(text, language="cpp"):
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S)]


# The whole programs and configs of other languages a guide shows: file suffix by the block's language.
OTHER_LANGUAGES = {"c": "c", "fortran": "f90", "toml": "toml", "python": "py"}


def other_files(page):
    files = {}
    for language, suffix in OTHER_LANGUAGES.items():
        found = blocks(page.read_text(encoding="utf-8"), language)
        if len(found) > 1:
            sys.exit(f"{page}: {len(found)} ```{language} blocks; a guide has at most one (a whole program or config)")
        if found:
            comment = "!" if language == "fortran" else "#" if language in ("toml", "python") else None
            note = HEADER.format(f"docs/{page.name}").removeprefix("// ")
            header = f"{comment} {note}" if comment else f"/* {note.rstrip()} */\n"
            files[f"guide_{page.stem}.{suffix}"] = header + found[0]
    return files


def is_file_scope(line):
    return line.startswith("#include") or re.match(r"namespace \w+ = [\w:]+;", line) is not None


def readme_programs(readme):
    found = blocks(readme.read_text(encoding="utf-8"))
    if len(found) < 2:
        sys.exit(f"{readme}: expected at least 2 ```cpp blocks (the first app, its data parallel scope), found "
                 f"{len(found)}")
    quick, distributed = found[:2]
    fit_lines = [line for line in quick.splitlines() if "learn.fit_one_cycle(" in line]
    if len(fit_lines) != 1:
        sys.exit(f"{readme}: the first ```cpp block must have exactly one learn.fit_one_cycle( line")
    header = HEADER.format("README.md")
    return {"quick_start.cpp": header + quick,
            "distributed.cpp": header + quick.replace(fit_lines[0] + "\n", distributed)}


def guide_program(page):
    found = blocks(page.read_text(encoding="utf-8"))
    if not found:
        sys.exit(f"{page}: no ```cpp block to build")
    top, functions, calls = [], [], []
    for k, block in enumerate(found, 1):
        body = []
        for line in block.splitlines():
            if is_file_scope(line):
                if line not in top:
                    top.append(line)
            else:
                body.append(line)
        line_no = page.read_text(encoding="utf-8")[: page.read_text(encoding="utf-8").find(block)].count("\n") + 1
        functions.append(f"// {page.name}, block {k} (line {line_no})\nvoid block_{k}() {{\n" +
                         "\n".join(("  " + l) if l else "" for l in body) + "\n}\n")
        calls.append(f"    std::cout << \"--- {page.name} block {k} (line {line_no})\\n\" << std::flush;\n"
                     f"    block_{k}();\n")
    includes = sorted(l for l in top if l.startswith("#include"))
    aliases = [l for l in top if not l.startswith("#include")]
    if "#include <iostream>" not in includes:
        includes.append("#include <iostream>")
    return (HEADER.format(f"docs/{page.name}") + "\n".join(includes) + "\n\n" + "\n".join(aliases) + "\n\nnamespace {\n\n" +
            "\n".join(functions) + "\n}  // namespace\n\nint main() {\n  try {\n" + "".join(calls) +
            "  } catch (const std::exception& e) {\n    std::cerr << \"error: \" << e.what() << \"\\n\";\n"
            "    return 1;\n  }\n  return 0;\n}\n")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    readme, docs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    files = readme_programs(readme)
    for guide in sys.argv[4:]:
        files[f"guide_{guide}.cpp"] = guide_program(docs / f"{guide}.md")
        files.update(other_files(docs / f"{guide}.md"))
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:  # unchanged: no rebuild
            path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

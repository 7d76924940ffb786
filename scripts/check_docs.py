#!/usr/bin/env python3
"""The lessons' budgets, boxes and links, checked on every test run (CTest: docs).

A lesson is a rung's README.md and every other .md in a rung directory (0[1-6]_*/) but
EXPERIMENTS.md. Prints each lesson's line count against its budget and fails when
  - a lesson is over 300 lines, an EXPERIMENTS.md over 200, the top README over 175;
  - a lesson does not open with the box (BOX_KEYS): the line after its title and the two
    after that are
        > **GPU:** the minimum architecture ...\
        > **Run:** `build/bench/attn_bench --rungs <this>,<below> --check`\
        > **Lab:** <lab ids of lab/exercises.json, comma-separated, or "none"> (...)
    where every rung the Run line names is registered (a quoted name in a rung's .cu) and
    every lab id is in lab/exercises.json;
  - results/ holds more than 60 files (the reference runs only);
  - a relative link in a .md names a file that does not exist, or a `file#L<n>` link a line
    past the file's end;
  - a `file#L<n>` link names a symbol that lines n-2 .. n+2 of the file do not contain
    (link_symbol() says which symbol a link names; a link that names none is only checked
    for existence);
  - a measured block differs from what scripts/lessons.py makes of the reference run's CSVs.
Standard library only. tests/python/test_check_docs.py tests the box and link rules.
"""

import json
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
LESSON_MAX = 300
EXPERIMENTS_MAX = 200
TOP_README_MAX = 175
RESULTS_MAX_FILES = 60
# Lessons allowed past LESSON_MAX, each with its reason.
OVER_BUDGET = {
}
# Lessons that do not open with the box yet, each with its reason.
NO_BOX = {
}
BOX_KEYS = ("> **GPU:** ", "> **Run:** ", "> **Lab:** ")
RUN_LINE = re.compile(r"`build/bench/attn_bench --rungs ([\w,]+) --check`")

LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")
# A line link: [text](target#L<n>). The text holds no brackets.
LINE_LINK = re.compile(r"\[([^\[\]\n]*)\]\(((?!https?:)[^)\s#]+)#L(\d+)\)")
# A code span that names a symbol: a (qualified) identifier, optionally followed by the
# argument list of a template and of a call: `name`, `ns::name`, `Type::member`,
# `obj.field`, `name(p, 2)`, `name<T>`. Anything else in backticks (`x = 0`, `1/√d`,
# `m_i = −∞`) names no symbol.
SYMBOL_SPAN = re.compile(r"^(?:[A-Za-z_]\w*(?:::|\.))*([A-Za-z_]\w*)\s*(?:<[^`]*>)?\s*(?:\([^`]*\))?$")
# A link text that names a file, not a symbol: `path/file.ext` or `path/file.ext:123`.
FILE_TEXT = re.compile(r"^[\w./-]+\.\w+(?::\d+(?:-\d+)?)?$")
# A code span at the end of the text before a link, and what separates it from the link.
SPAN_BEFORE_LINK = re.compile(r"`([^`\n]+)`([\s(,]*)$")
WINDOW = 2  # a named symbol must appear within this many lines of the linked one


def lines(path):
    return len(path.read_text().splitlines())


def rel(path):
    return path.relative_to(REPO).as_posix()


def lessons():
    return [p for p in sorted(REPO.glob("0[1-6]_*/*.md")) if p.name != "EXPERIMENTS.md"]


def budgets():
    rows, failures = [], []

    def check(name, count, limit, exempt=None):
        ok = count <= limit or exempt is not None
        note = f"   exempt: {exempt}" if exempt and count > limit else ("" if ok else "   OVER")
        rows.append(f"  {name:<44} {count:>5} / {limit}{note}")
        if not ok:
            failures.append(f"{name}: {count} lines, budget {limit}")

    check("README.md", lines(REPO / "README.md"), TOP_README_MAX)
    for lesson in lessons():
        check(rel(lesson), lines(lesson), LESSON_MAX, OVER_BUDGET.get(rel(lesson)))
    for exp in sorted(REPO.glob("0[1-6]_*/EXPERIMENTS.md")):
        check(rel(exp), lines(exp), EXPERIMENTS_MAX)
    return rows, failures


def registered_stages():
    """Every quoted name a rung's .cu registers could use: "01_naive", "06d_fa3", ..."""
    names = set()
    for src in REPO.glob("0[1-6]_*/*.cu"):
        names.update(re.findall(r'"(0\d\w*)"', src.read_text(errors="replace")))
    return names


def lab_ids():
    table = json.loads((REPO / "lab" / "exercises.json").read_text())
    return {e["id"] for e in table["exercises"]}


def box_problems(text, stages, labs):
    """What is wrong with the box a lesson opens with (an empty list when it is right)."""
    body = text.splitlines()
    if not body or not body[0].startswith("# "):
        return ["the lesson does not start with a '# ' title"]
    rest = body[1:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    box = rest[:3]
    for n, (key, line) in enumerate(zip(BOX_KEYS, box + [""] * (3 - len(box))), 1):
        if not line.startswith(key):
            return [f"the box's line {n} must start with '{key.strip()}'"]
    problems = []
    for line in box[:2]:
        if not line.endswith("\\"):
            problems.append(f"box line '{line[:30]}...' must end with '\\' (a line break)")
    run = RUN_LINE.search(box[1])
    if not run:
        problems.append("the Run line must hold `build/bench/attn_bench --rungs <this>,<below> --check`")
    else:
        problems += [f"the Run line names {r}, which no rung registers"
                     for r in run.group(1).split(",") if r not in stages]
    head = box[2][len(BOX_KEYS[2]):].split("(")[0].strip()
    if head != "none":
        ids = [t for t in re.split(r"[,\s]+", head) if t]
        if not ids:
            problems.append("the Lab line must name lab ids or 'none'")
        problems += [f"the Lab line names lab {t}, which lab/exercises.json does not hold"
                     for t in ids if t not in labs]
    return problems


def missing_boxes():
    bad = []
    stages, labs = registered_stages(), lab_ids()
    for lesson in lessons():
        if rel(lesson) in NO_BOX:
            continue
        bad += [f"{rel(lesson)}: {p}" for p in box_problems(lesson.read_text(), stages, labs)]
    return bad


def results_files():
    try:
        out = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True)
        files = [f for f in out.stdout.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: count what is there
        files = [p for p in (REPO / "results").rglob("*") if p.is_file()]
    return len(files)


def link_files():
    return sorted(REPO.glob("*.md")) + sorted(REPO.glob("0[1-6]_*/*.md"))


def broken_links():
    bad = []
    for md in link_files():
        for m in LINK.finditer(md.read_text()):
            target, _, anchor = m.group(1).partition("#")
            path = (md.parent / target).resolve()
            where = f"{rel(md)}: {m.group(1)}"
            if not path.exists():
                bad.append(f"{where} (no such file)")
            elif anchor.startswith("L") and anchor[1:].isdigit() and path.is_file():
                if int(anchor[1:]) > lines(path):
                    bad.append(f"{where} (the file has {lines(path)} lines)")
    return bad


def link_symbol(text, before):
    """The symbol a line link names, or None.

    text: the link's text; before: the markdown right before the link's "[".
    1. A link text that is a symbol, in backticks or bare (`softmax_bytes`,
       `hbm::softmax_bytes(p, 2)`), names that symbol.
    2. A link text that names a file (`hbm_model.cpp:44`) names the symbol of the code span
       right before the link, when blanks (at most one line break) and at most one "(" or
       "," separate the two: `softmax_bytes` [`hbm_model.cpp:44`](...),
       `softmax_bytes(p, 2)` ([`hbm_model.cpp:44`](...)), `softmax_bytes`,\\n[...](...).
    3. Anything else (prose, a file link after prose) names no symbol.
    Of a qualified name the last component is the symbol: hbm::softmax_bytes -> softmax_bytes.
    """
    bare = text.strip().strip("`").strip()
    if not FILE_TEXT.match(bare):
        m = SYMBOL_SPAN.match(bare)
        return m.group(1) if m else None
    m = SPAN_BEFORE_LINK.search(before)
    if not m:
        return None
    sep = m.group(2)
    if sep.count("\n") > 1 or sep.count("(") + sep.count(",") > 1:
        return None
    m = SYMBOL_SPAN.match(m.group(1).strip())
    return m.group(1) if m else None


def symbol_near(target_lines, line, symbol):
    """Whether symbol appears as a whole word on lines line-WINDOW .. line+WINDOW (1-based)."""
    word = re.compile(r"(?<!\w)" + re.escape(symbol) + r"(?!\w)")
    lo, hi = max(1, line - WINDOW), min(len(target_lines), line + WINDOW)
    return any(word.search(target_lines[k - 1]) for k in range(lo, hi + 1))


def misnamed_links_in(md):
    """The file#L<n> links of one .md whose lines n-2 .. n+2 lack the symbol the link names."""
    bad = []
    text = md.read_text()
    for m in LINE_LINK.finditer(text):
        path = (md.parent / m.group(2)).resolve()
        if not path.is_file():
            continue  # broken_links() reports it
        symbol = link_symbol(m.group(1), text[max(0, m.start() - 200):m.start()])
        if symbol is None:
            continue
        target = path.read_text(errors="replace").splitlines()
        line = int(m.group(3))
        if line <= len(target) and not symbol_near(target, line, symbol):
            lineno = text.count("\n", 0, m.start()) + 1
            bad.append(f"{md.name}:{lineno}: {m.group(2)}#L{line} does not show `{symbol}` within {WINDOW} lines")
    return bad


def misnamed_links():
    return [f"{rel(md.parent)}/{b}" if md.parent != REPO else b
            for md in link_files() for b in misnamed_links_in(md)]


def main():
    rows, failures = budgets()
    print("lesson line counts (lines / budget):")
    print("\n".join(rows))
    n = results_files()
    print(f"  results/ files{'':<29} {n:>5} / {RESULTS_MAX_FILES}")
    if n > RESULTS_MAX_FILES:
        failures.append(f"results/ holds {n} files, at most {RESULTS_MAX_FILES}: it keeps the reference runs only")
    failures += [f"lesson box: {b}" for b in missing_boxes()]
    failures += [f"broken link {b}" for b in broken_links()]
    failures += [f"link to the wrong line: {b}" for b in misnamed_links()]
    stale = subprocess.run([sys.executable, str(REPO / "scripts" / "lessons.py"), "--check"], cwd=REPO,
                           capture_output=True, text=True)
    if stale.returncode != 0:
        failures.append((stale.stdout + stale.stderr).strip())
    for f in failures:
        print("FAIL: " + f)
    print(f"check_docs: {'FAILED' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

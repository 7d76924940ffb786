#!/usr/bin/env python3
"""The lessons' budgets and links, checked on every test run (CTest: docs).

Prints each lesson's line count against its budget and fails when
  - a rung README (01-05) is over 400 lines, rung 06's lessons (every .md in 06_fa3_hopper/
    but EXPERIMENTS.md) over 1030 together (1000 of text, 30 for the figures' lines), an EXPERIMENTS.md over 200, the top README over 150;
  - results/ holds more than 60 files (the reference runs only);
  - a relative link in a .md names a file that does not exist, or a `file#L<n>` link a line
    past the file's end;
  - a measured block differs from what scripts/lessons.py makes of the reference run's CSVs.
Standard library only.
"""

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNG_README_MAX = 400
RUNG06_MAX = 1030  # 1000 lines of text and three lines per figure (image, caption, blank)
EXPERIMENTS_MAX = 200
TOP_README_MAX = 150
RESULTS_MAX_FILES = 60
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s]+)\)")


def lines(path):
    return len(path.read_text().splitlines())


def budgets():
    rows, failures = [], []

    def check(name, count, limit):
        ok = count <= limit
        rows.append(f"  {name:<44} {count:>5} / {limit}{'' if ok else '   OVER'}")
        if not ok:
            failures.append(f"{name}: {count} lines, budget {limit}")

    check("README.md", lines(REPO / "README.md"), TOP_README_MAX)
    for rung in sorted(REPO.glob("0[1-5]_*/README.md")):
        check(str(rung.relative_to(REPO)), lines(rung), RUNG_README_MAX)
    lessons06 = [p for p in sorted(REPO.glob("06_*/*.md")) if p.name != "EXPERIMENTS.md"]
    check("06_fa3_hopper/*.md (" + ", ".join(p.name for p in lessons06) + ")",
          sum(lines(p) for p in lessons06), RUNG06_MAX)
    for exp in sorted(REPO.glob("0[1-6]_*/EXPERIMENTS.md")):
        check(str(exp.relative_to(REPO)), lines(exp), EXPERIMENTS_MAX)
    return rows, failures


def results_files():
    try:
        out = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True)
        files = [f for f in out.stdout.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: count what is there
        files = [p for p in (REPO / "results").rglob("*") if p.is_file()]
    return len(files)


def broken_links():
    bad = []
    for md in sorted(REPO.glob("*.md")) + sorted(REPO.glob("0[1-6]_*/*.md")):
        for m in LINK.finditer(md.read_text()):
            target, _, anchor = m.group(1).partition("#")
            path = (md.parent / target).resolve()
            where = f"{md.relative_to(REPO)}: {m.group(1)}"
            if not path.exists():
                bad.append(f"{where} (no such file)")
            elif anchor.startswith("L") and anchor[1:].isdigit() and path.is_file():
                if int(anchor[1:]) > lines(path):
                    bad.append(f"{where} (the file has {lines(path)} lines)")
    return bad


def main():
    rows, failures = budgets()
    print("lesson line counts (lines / budget):")
    print("\n".join(rows))
    n = results_files()
    print(f"  results/ files{'':<29} {n:>5} / {RESULTS_MAX_FILES}")
    if n > RESULTS_MAX_FILES:
        failures.append(f"results/ holds {n} files, at most {RESULTS_MAX_FILES}: it keeps the reference runs only")
    failures += [f"broken link {b}" for b in broken_links()]
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

#!/usr/bin/env python3
"""Lab mode (LABS.md): hand out a rung as an exercise, build only what it needs, grade it.

  lab.py list [--json]                        the exercises: rung, regions, time, prerequisites, GPUs
  lab.py make ID --out DIR [--only-needed]
                                              a student copy: ID's regions replaced by stubs, EXERCISE.md
  lab.py hint ID [REGION] [--tier N]          one tier of the hints: 1 the idea, 2 where and how, 3 formulas
  lab.py check ID [--json FILE] [--build-dir DIR] [--arch A]
                                              configure and build the lab (./build-lab-ID), run the grader
  lab.py grade ID SUBMISSION... --json FILE   grade a class: each submission's region files, built and checked
  lab.py verify                               markers balanced and named, the table consistent (no GPU)
  lab.py audit [--ids ...]                    each student copy: no answer left in it, links still right (no GPU)
  lab.py ci [--work DIR]                      verify, then make + configure + build every exercise (no GPU)
  lab.py selftest [--work DIR] [--log FILE]   on a GPU: the stubs fail, the references pass, rebuild times
  lab.py config ID --out DIR                  what a lab build needs (cmake/lab.cmake runs this)

The exercises are declared once, in lab/exercises.json. A region is the code between the
markers LAB:BEGIN <name> and LAB:END (in // comments, marker lines included) of the reference
source; `make` replaces it, in as many lines, with a TODO (the region's task) and the table's
stub. Standard library only.
"""

import argparse
import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = Path("lab/exercises.json")
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c", ".in"}
BEGIN = re.compile(r"//.*?\bLAB:BEGIN\b\s*([A-Za-z0-9_.\-]*)")
END = re.compile(r"//.*?\bLAB:END\b")
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", ".scratch", ".deps", ".whl", "node_modules"}
GRADER = Path("lab") / "lab_grade"
SOURCE_SHA = Path("lab") / "source_sha"  # in a student copy: the commit it was made from (make)
SKIP_RC = 77
GPUS = {
    80: "sm_80 or newer: A100, A10, A40, RTX 30xx, L4, L40, RTX 40xx, H100, H200",
    90: "sm_90a: H100, H200 (Hopper only)",
}


def fail(msg):
    print(f"lab.py: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- the table

def load_table(root=REPO):
    path = root / TABLE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        fail(f"cannot read {path}: {e}")


def exercise(table, ex_id, ready=True):
    for ex in table["exercises"]:
        if ex["id"] == ex_id:
            if ready and ex.get("status") != "ready":
                fail(f"exercise {ex_id} is {ex.get('status')}, not ready (LABS.md)")
            return ex
    fail(f"no exercise '{ex_id}'; there are: {', '.join(e['id'] for e in table['exercises'])}")


def ready_exercises(table):
    return [ex for ex in table["exercises"] if ex.get("status") == "ready"]


def resolved_checks(table, ex):
    """The exercise's checks: name, kind, parameters (strings) and hint (the kind's by default)."""
    out = []
    for c in ex["checks"]:
        kind = c.get("kind", c["name"])
        params = {k: str(v) for k, v in c.items() if k not in ("name", "hint")}
        hint = c.get("hint") or table["check_kinds"][kind]["hint"]
        out.append({"name": c["name"], "kind": kind, "params": params, "hint": hint})
    return out


def gpus_text(min_sm):
    return GPUS.get(min_sm, f"sm_{min_sm} or newer")


# ---------------------------------------------------------------- files and markers

def is_repo_copy(d):
    return (d / "CMakeLists.txt").is_file() and (d / TABLE).is_file()


def tree_files(root):
    """Relative paths of the tree's files: git's tracked and untracked-but-not-ignored files when
    root is a git checkout, else a walk. Build directories and nested copies are left out."""
    names = None
    if (root / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                 capture_output=True, check=True).stdout
            names = [n for n in out.decode("utf-8", "surrogateescape").split("\0") if n]
        except (OSError, subprocess.CalledProcessError):
            names = None
    if names is None:
        names = []
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for f in sorted(filenames):
                names.append((here / f).relative_to(root).as_posix())
    excluded = {}

    def skip_dir(rel):  # a build tree, or a student copy made inside this one
        if rel not in excluded:
            d = root / rel
            excluded[rel] = (rel.split("/")[0].startswith("build") or (d / "CMakeCache.txt").exists()
                             or is_repo_copy(d) or rel.split("/")[-1] in SKIPPED_DIRS)
        return excluded[rel]

    files = []
    for n in names:
        parts = n.split("/")
        if any(skip_dir("/".join(parts[:k])) for k in range(1, len(parts))):
            continue
        if (root / n).is_file():
            files.append(n)
    return sorted(set(files))


class Region:
    def __init__(self, name, file, begin, end):
        self.name, self.file, self.begin, self.end = name, file, begin, end  # lines, 1-based, inclusive


def scan_lines(lines, rel):
    """Regions of one file, and what is wrong with its markers."""
    regions, errors, open_at, open_name = [], [], None, None
    for n, line in enumerate(lines, 1):
        b, e = BEGIN.search(line), END.search(line)
        if b:
            if open_at is not None:
                errors.append(f"{rel}:{n}: LAB:BEGIN inside region '{open_name}' (opened at line {open_at})")
            elif not b.group(1):
                errors.append(f"{rel}:{n}: LAB:BEGIN without a name")
            open_at, open_name = n, b.group(1)
        if e:
            if open_at is None:
                errors.append(f"{rel}:{n}: LAB:END without LAB:BEGIN")
            else:
                regions.append(Region(open_name, rel, open_at, n))
            open_at = None
    if open_at is not None:
        errors.append(f"{rel}:{open_at}: region '{open_name}' has no LAB:END")
    return regions, errors


def read_lines(path):
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def scan_tree(root):
    regions, errors = [], []
    for rel in tree_files(root):
        if Path(rel).suffix not in SOURCE_SUFFIXES or rel.startswith("lab/"):
            continue
        try:
            lines = read_lines(root / rel)
        except UnicodeDecodeError:
            continue
        if not any("LAB:" in line for line in lines):
            continue
        r, e = scan_lines(lines, rel)
        regions += r
        errors += e
    return regions, errors


def write_if_changed(path, data):
    """Keeps the file (and its time stamp, so the build stays incremental) when nothing changed."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if path.is_file() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


# ---------------------------------------------------------------- list

def cmd_list(args):
    table = load_table()
    if args.json:
        rows = [{"id": ex["id"], "status": ex.get("status"), "title": ex["title"], "rung": ex["rung"],
                 "regions": [r["name"] for r in ex.get("regions", [])], "minutes": ex.get("minutes"),
                 "prerequisites": ex.get("prerequisites", []), "gpus": gpus_text(ex["min_sm"])}
                for ex in table["exercises"]]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    print(f"{'id':<5} {'rung':<18} {'min':>4}  {'after':<6} {'GPU':<7} title / regions")
    for ex in table["exercises"]:
        ready = ex.get("status") == "ready"
        minutes = str(ex.get("minutes", "")) if ready else "-"
        after = ",".join(ex.get("prerequisites", [])) or "-"
        gpu = f"sm_{ex['min_sm']}" + ("a" if ex["min_sm"] == 90 else "+")
        print(f"{ex['id']:<5} {ex['rung']:<18} {minutes:>4}  {after:<6} {gpu:<7} {ex['title']}"
              + ("" if ready else "  [planned]"))
        for r in ex.get("regions", []):
            print(f"{'':<44}{r['name']:<18} {r['file']}")
    print("\nGPUs: sm_80+ = " + GPUS[80].split(": ")[1] + "; sm_90a = " + GPUS[90].split(": ")[1])
    return 0


# ---------------------------------------------------------------- make

def wrapped_comment(text, indent, width=100):
    lines = textwrap.wrap(text, width=max(40, width - len(indent) - 3), break_long_words=False,
                          break_on_hyphens=False)
    return [f"{indent}// {lines[0]}\n"] + [f"{indent}//   {line}\n" for line in lines[1:]]


def with_comment(line, comment):
    """line (no newline) with `comment` appended to its // comment, or as a new one."""
    return f"{line}; {comment}" if "//" in line else f"{line}  // {comment}"


def stub_block(ex, spec, indent, n):
    """The stub that replaces a region of n lines, in exactly n lines, so that every line after
    it keeps its number and the lessons' file:line links stay right in the student copy. The
    longest form that fits: the marker, the TODO (the region's task), a note, the stub, blank
    lines up to n, the end marker; in a short region the TODO shrinks to a pointer, then the
    markers move onto the stub's lines, then the stub's statements share lines."""
    name, stub = spec["name"], list(spec["stub"])
    begin, end = f"// LAB:BEGIN {name}", "// LAB:END"
    todo = wrapped_comment(f"TODO(lab {ex['id']}): {spec['task']}.", indent)
    note = wrapped_comment(f"Your code here. The stub below compiles and is wrong; `scripts/lab.py hint "
                           f"{ex['id']}` gives hints, one tier at a time.", indent)
    body = [f"{indent}{line}\n" for line in stub]
    pointer = f"TODO(lab {ex['id']}): EXERCISE.md, region {name}"
    for form in ([f"{indent}{begin}\n"] + todo + note + body,
                 [f"{indent}{begin}\n"] + todo + body,
                 [f"{indent}{begin}  {pointer}\n"] + body,
                 [with_comment(body[0].rstrip("\n"), f"LAB:BEGIN {name} {pointer}") + "\n"] + body[1:]):
        if len(form) + 1 <= n:
            return form + ["\n"] * (n - len(form) - 1) + [f"{indent}{end}\n"]
    # The markers on the stub's own lines; statements joined so that they fit in n lines.
    if len(stub) > n:
        head, tail = stub[:n - 1], stub[n - 1:]
        joined = " ".join(re.sub(r"\s*//.*$", "", t) for t in tail[:-1])
        stub = head + [(joined + " " if joined else "") + tail[-1]]
    lines = [f"{indent}{line}" for line in stub]
    lines[0] = with_comment(lines[0], f"LAB:BEGIN {name} {pointer}")
    lines[-1] = with_comment(lines[-1], "LAB:END")
    lines = [ln + "\n" for ln in lines]
    return lines + ["\n"] * (n - len(lines)) if len(lines) < n else lines


def stubbed(lines, rel, ex):
    """The lines of one file with the exercise's regions in it replaced by stubs of the same length."""
    regions, errors = scan_lines(lines, rel)
    if errors:
        fail("; ".join(errors))
    specs = {r["name"]: r for r in ex["regions"] if r["file"] == rel}
    for region in sorted(regions, key=lambda r: -r.begin):  # bottom up: line numbers above stay valid
        if region.name not in specs:
            continue
        # The region's indent: its first line's, or the first code line's after a directive
        # (#pragma unroll sits in column 0).
        code = [ln for ln in lines[region.begin - 1:region.end] if ln.strip() and not ln.lstrip().startswith("#")]
        first = code[0] if code else lines[region.begin - 1]
        indent = first[:len(first) - len(first.lstrip())]
        n = region.end - region.begin + 1
        block = stub_block(ex, specs.pop(region.name), indent, n)
        assert len(block) == n, (region.name, len(block), n)
        lines[region.begin - 1:region.end] = block
    if specs:
        fail(f"{rel}: no region {', '.join(specs)}")
    return lines


# ---------------------------------------------------------------- hints: in tiers, not in plain sight

HINT_PREFIX = "b64:"


def hint_text(h):
    """A hint as the table stores it: plain in the repository, base64 in a student copy (so that
    grep or a glance at the table does not show tier 3 before the student asks for it)."""
    return base64.b64decode(h[len(HINT_PREFIX):]).decode("utf-8") if h.startswith(HINT_PREFIX) else h


def encoded(h):
    return h if h.startswith(HINT_PREFIX) else HINT_PREFIX + base64.b64encode(h.encode("utf-8")).decode("ascii")


def copy_table(table):
    """The table as a student copy holds it: every region's hints and forbidden expressions (the
    answer's key parts, which `audit` looks for) encoded."""
    out = json.loads(json.dumps(table))
    for ex in out["exercises"]:
        for r in ex.get("regions", []):
            r["hints"] = [encoded(h) for h in r["hints"]]
            r["forbidden"] = [encoded(f) for f in r.get("forbidden", [])]
        for leak in ex.get("leaks_pending", []):
            leak["text"] = encoded(leak["text"])
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


TIER_NAMES = {1: "the idea", 2: "where and how, in this code", 3: "the formulas"}


def cmd_hint(args):
    table = load_table(Path(args.source).resolve() if args.source else REPO)
    ex = exercise(table, args.id)
    regions = ex["regions"]
    if args.region:
        regions = [r for r in regions if args.region in (r["name"], r["name"].split(".", 1)[1])]
        if not regions:
            fail(f"lab {ex['id']} has no region {args.region}; its regions: "
                 f"{', '.join(r['name'] for r in ex['regions'])}")
    for r in regions:
        tiers = [hint_text(h) for h in r["hints"]]
        tier = min(args.tier, len(tiers))
        print(f"{r['name']}, hint tier {tier} of {len(tiers)} ({TIER_NAMES.get(tier, '')}):")
        print(textwrap.indent(textwrap.fill(tiers[tier - 1], 96, break_long_words=False,
                                            break_on_hyphens=False), "  "))
        if tier < len(tiers):
            print(f"  (next: scripts/lab.py hint {ex['id']} {r['name']} --tier {tier + 1})")
        print()
    return 0


def source_sha(root=REPO):
    """The commit of the lab's own source tree: in a student copy, the one `make` wrote into it
    (lab/source_sha); in a checkout, git's HEAD (-dirty when a tracked file outside results/
    differs) if root is the top of its own repository, never that of a repository enclosing it."""
    if os.environ.get("ATTN_GIT_SHA"):  # a copy of the tree whose .git is not its commit
        return os.environ["ATTN_GIT_SHA"]
    marker = root / SOURCE_SHA
    if marker.is_file():
        return marker.read_text(encoding="utf-8").strip() or "unknown"

    def git(*cmd):
        return subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True)

    try:
        top = git("rev-parse", "--show-toplevel").stdout.strip()
        if not top or Path(top).resolve() != root.resolve():
            return "unknown"
        sha = git("rev-parse", "--short", "HEAD").stdout.strip()
        if not sha:
            return "unknown"
        if git("diff", "--quiet", "HEAD", "--", ".", ":(exclude)results").returncode != 0:
            sha += "-dirty"
        return sha
    except OSError:
        return "unknown"


def make_copy(ex_id, out, only_needed=False, root=REPO, quiet=False):
    table = load_table(root)
    ex = exercise(table, ex_id)
    out = Path(out).resolve()
    if out == root:
        fail("--out must not be the repository itself")
    if out.exists() and any(out.iterdir()) and not is_repo_copy(out):
        fail(f"{out} exists and is not a copy of this repository; choose an empty or new directory")
    all_files = tree_files(root)
    files = [f for f in all_files if f not in ex.get("withhold", [])]
    if only_needed:
        files = [f for f in files if not re.match(r"0\d_", f) or f.split("/")[0] in ex["rungs"]]
    for rel in set(all_files) - set(files):  # an earlier copy in out may hold it
        if (out / rel).is_file():
            (out / rel).unlink()
    region_files = {r["file"] for r in ex["regions"]}
    absent = absent_targets(all_files, files)
    changed = 0
    for rel in files:
        src = root / rel
        if rel in region_files:
            data = "".join(stubbed(read_lines(src), rel, ex))
        elif rel.endswith(".md") and absent:
            data = unlinked(src.read_text(encoding="utf-8"), rel, absent)
        elif rel == TABLE.as_posix():
            data = copy_table(table)
        elif rel == SOURCE_SHA.as_posix():
            continue  # written below
        else:
            data = src.read_bytes()
        changed += write_if_changed(out / rel, data)
        shutil.copymode(src, out / rel)
    write_if_changed(out / SOURCE_SHA, source_sha(root) + "\n")
    write_if_changed(out / "EXERCISE.md", exercise_md(table, ex, out, root))
    if not quiet:
        print(f"lab {ex_id}: {len(files)} files in {out} ({changed} written), the regions "
              f"{', '.join(r['name'] for r in ex['regions'])} stubbed; start with {out / 'EXERCISE.md'}")
    return out


# A markdown link or image: [text](target) or ![text](target), the target relative.
MD_LINK = re.compile(r"(!?)\[([^\[\]\n]*)\]\(((?!https?:|mailto:|#)[^)\s]+)\)")


def absent_targets(all_files, kept):
    """What a copy that holds `kept` of the tree's files `all_files` lacks: the files left out, and
    the directories none of whose files it holds (set of relative paths)."""
    kept = set(kept)
    absent = set(all_files) - kept
    dirs_kept = {"/".join(f.split("/")[:k]) for f in kept for k in range(1, f.count("/") + 1)}
    absent |= {"/".join(f.split("/")[:k]) for f in absent for k in range(1, f.count("/") + 1)} - dirs_kept
    return absent


def link_target(md_rel, target):
    """The path (relative to the tree's top) that a relative link in md_rel names, or None."""
    path = os.path.normpath(os.path.join(os.path.dirname(md_rel), target.split("#")[0]))
    return None if path.startswith("..") else Path(path).as_posix().rstrip("/")


def unlinked(text, md_rel, absent):
    """A lesson's text with each link to a file or directory the copy lacks (absent) turned into
    its plain text, so that the copy holds no broken link (and its lines keep their numbers)."""
    def plain(m):
        return m.group(2) if link_target(md_rel, m.group(3)) in absent else m.group(0)
    return MD_LINK.sub(plain, text)


def exercise_md(table, ex, copy, root):
    kinds = table["check_kinds"]
    prereq = ", ".join(f"lab {p}" for p in ex["prerequisites"]) or "none"
    body = (root / ex["text"]).read_text(encoding="utf-8").strip()
    md = [f"# Lab {ex['id']}: {ex['title']}", "",
          "| | |", "|---|---|",
          f"| rung | [`{ex['rung']}`]({ex['rung']}/README.md) (read its lesson first) |",
          f"| time | about {ex['minutes']} minutes |",
          f"| prerequisites | {prereq} |",
          f"| GPU | {gpus_text(ex['min_sm'])} |", "",
          "## What to implement", "", body, "",
          "## Where", "",
          "Fill in the regions between `// LAB:BEGIN <name>` and `// LAB:END`. Each holds a stub that",
          "compiles and fails some of the grader's checks; everything outside the regions is the reference code.", "",
          "| region | file | what |", "|---|---|---|"]
    for spec in ex["regions"]:
        line = ""
        path = copy / spec["file"]
        if path.is_file():
            for r in scan_lines(read_lines(path), spec["file"])[0]:
                if r.name == spec["name"]:
                    line = r.begin
        link = f"[`{spec['file']}:{line}`]({spec['file']}#L{line})" if line else f"`{spec['file']}`"
        md.append(f"| `{spec['name']}` | {link} | {spec['task']} |")
    if ex.get("withhold"):
        md += ["", "Not in this copy, because they hold this lab's answer in some form (the lab build does not "
               "compile them; the lessons name them as plain text): "
               + ", ".join(f"`{f}`" for f in ex["withhold"]) + "."]
    tiers = max(len(spec["hints"]) for spec in ex["regions"])
    md += ["", "## Hints", "",
           f"Try without them first. Each region has {tiers} tiers: 1 names the idea, 2 says where and how in this "
           f"code, {tiers} gives the formulas. Ask for one tier at a time:", "",
           "```sh",
           f"scripts/lab.py hint {ex['id']}".ljust(48) + "# tier 1 for every region",
           f"scripts/lab.py hint {ex['id']} {ex['regions'][0]['name']} --tier 2".ljust(48) + "# tier 2 for one region",
           "```", ""]
    md += ["## What the grader checks", "", "| check | what it verifies |", "|---|---|"]
    for c in resolved_checks(table, ex):
        extra = {k: v for k, v in c["params"].items() if k not in ("kind",)}
        detail = f" ({', '.join(f'{k} = {v}' for k, v in extra.items())})" if extra else ""
        md.append(f"| `{c['name']}` | {kinds[c['kind']]['what']}{detail} |")
    md += ["", f"The untouched stubs fail {', '.join('`' + c + '`' for c in ex['stub_fails'])}. A failing check "
           "prints what it saw and a hint. Without a GPU every check reports \"skipped: no GPU found\"; the run is "
           "skipped, never passed.", "",
           "## Build and grade", "",
           "```sh",
           f"scripts/lab.py check {ex['id']}                   # configure + build ./build-lab-{ex['id']}, run every check",
           f"scripts/lab.py check {ex['id']} --json result.json  # the same, and the result for an autograder",
           "```", "",
           "or with CMake alone:", "",
           "```sh",
           (f"cmake -B build -G Ninja -DATTN_LAB={ex['id']}   # sm_90a only: H100, H200" if ex["min_sm"] >= 90 else
            f"cmake -B build -G Ninja -DATTN_LAB={ex['id']}   # add -DCMAKE_CUDA_ARCHITECTURES=80 on an A100, 86 on an"
            " A10/RTX 3090, 89 on an L4/RTX 4090 (default: 90a, H100)"),
           "cmake --build build",
           f"ctest --test-dir build -L lab{ex['id']} --output-on-failure",
           "```", "",
           f"The lab build compiles only {', '.join(ex['rungs'])}"
           + (" (only the kernels this lab needs)" if ex.get("build") else "") + ", the harness and the grader; "
           "after an edit only "
           "the translation units that include your file are rebuilt, and a register spill warns instead of "
           "failing the build. `scripts/lab.py check` picks the architecture of the GPU it finds.", ""]
    return "\n".join(md)


def cmd_make(args):
    make_copy(args.id, args.out, only_needed=args.only_needed)
    return 0


# ---------------------------------------------------------------- config (cmake/lab.cmake)

def cxx_raw(s):
    if ")lab\"" in s:
        fail(f"text contains )lab\": {s}")
    return f'R"lab({s})lab"'


def cxx_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cmd_config(args):
    table = load_table()
    ex = exercise(table, args.id)
    checks = resolved_checks(table, ex)
    out = Path(args.out)
    head = f"Generated by scripts/lab.py config {ex['id']} from lab/exercises.json: do not edit."
    cmake = [f"# {head}", f'set(LAB_ID "{ex["id"]}")', f'set(LAB_STAGE "{ex["stage"]}")',
             f"set(LAB_RUNGS {' '.join(ex['rungs'])})", f"set(LAB_CHECKS {' '.join(c['name'] for c in checks)})",
             f'set(LAB_PROBE "{ex.get("probe", "")}")']
    # The rungs' lists of kernels to compile that this lab replaces (their CMakeLists read LAB_<list>).
    for name, values in ex.get("build", {}).items():
        cmake.append(f'set(LAB_{name} "{";".join(str(v) for v in values)}")')
    cmake.append("")
    inc = [f"// {head}", f"constexpr const char* kLabId = {cxx_str(ex['id'])};",
           f"constexpr const char* kLabTitle = {cxx_raw(ex['title'])};",
           f"constexpr const char* kLabStage = {cxx_str(ex['stage'])};",
           f"constexpr int kLabMinSm = {int(ex['min_sm'])};",
           "const std::vector<CheckSpec> kLabChecks = {"]
    for c in checks:
        params = ", ".join(f"{{{cxx_str(k)}, {cxx_str(v)}}}" for k, v in c["params"].items())
        inc.append(f"    {{{cxx_str(c['name'])}, {{{params}}}, {cxx_raw(c['hint'])}}},")
    inc += ["};", ""]
    write_if_changed(out / "lab_config.cmake", "\n".join(cmake))
    write_if_changed(out / "lab_exercise.inc", "\n".join(inc))
    return 0


# ---------------------------------------------------------------- build and grade

def detect_arch(min_sm):
    """The CUDA architecture of the first GPU (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        major, minor = out[0].strip().split(".")
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return None
    sm = int(major) * 10 + int(minor)
    if min_sm >= 90:  # Hopper-only code (wgmma, setmaxnreg) builds for sm_90a alone; older GPUs then skip
        return "90a"
    return f"{sm}a" if sm == 90 else str(sm)


def lab_arch(arch, ex):
    """arch (a comma list) for exercise ex: an sm_90a exercise builds for 90a whatever else is asked."""
    if ex["min_sm"] >= 90 and "90a" not in arch.split(","):
        return "90a"
    return arch


def run_logged(cmd, cwd=None):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    return p.returncode, p.stdout


def cached_lab(build):
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return None
    m = re.search(r"^ATTN_LAB:STRING=(.*)$", cache.read_text(errors="replace"), re.M)
    return m.group(1) if m else ""


def build_lab(source, build, ex, arch=None, jobs=None):
    """Configure (when needed) and build the lab's grader; (ok, seconds, output)."""
    start = time.monotonic()
    log = ""
    if cached_lab(build) != ex["id"]:
        cmd = ["cmake", "-S", str(source), "-B", str(build), f"-DATTN_LAB={ex['id']}"]
        if shutil.which("ninja") and not (build / "CMakeCache.txt").exists():
            cmd += ["-G", "Ninja"]
        arch = lab_arch(arch, ex) if arch else detect_arch(ex["min_sm"])
        if arch:
            cmd.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch.replace(',', ';')}")
        rc, out = run_logged(cmd)
        log += out
        if rc:
            return False, time.monotonic() - start, log
    cmd = ["cmake", "--build", str(build), "--target", "lab_grade"] + (["-j", str(jobs)] if jobs else [])
    rc, out = run_logged(cmd)
    return rc == 0, time.monotonic() - start, log + out


def grade_checks(table, ex, build, timeout):
    """Runs the grader once per check (a crash costs one check); the results. After a check that
    never answers (a kernel that hangs, which the next checks would most likely hang on too) the
    remaining checks are not run."""
    grader = build / GRADER
    results, gpu, sha, hung = [], "none", "", None
    for c in resolved_checks(table, ex):
        if hung:
            results.append({"name": c["name"], "status": "failed", "seconds": 0.0, "hint": c["hint"],
                            "detail": f"not run: check {hung} did not finish in {timeout} s"})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            start = time.monotonic()
            try:
                p = subprocess.run([str(grader), "--check", c["name"], "--json", str(out)], capture_output=True,
                                   text=True, errors="replace", timeout=timeout)
                rc, text = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired:
                rc, text = None, ""
            seconds = time.monotonic() - start
            if out.is_file():
                doc = json.loads(out.read_text(encoding="utf-8"))
                gpu, sha = doc.get("gpu", gpu), doc.get("git_sha", sha)
                r = doc["checks"][0]
            elif rc is None:
                hung = c["name"]
                r = {"name": c["name"], "status": "failed", "seconds": seconds,
                     "detail": f"no answer after {timeout} s: a kernel that never ends?"}
            else:
                tail = " | ".join(text.strip().splitlines()[-3:])
                r = {"name": c["name"], "status": "failed", "seconds": seconds,
                     "detail": f"the grader stopped (exit code {rc}): {tail}"}
            r["hint"] = c["hint"] if r["status"] == "failed" else ""
            results.append(r)
    return results, gpu, sha


def summary(ex, results, gpu="none", sha="", build_seconds=None, build_ok=True, build_log=""):
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "skipped")}
    status = ("build_failed" if not build_ok else "failed" if counts["failed"]
              else "passed" if counts["passed"] else "skipped")
    doc = {"exercise": ex["id"], "title": ex["title"], "stage": ex["stage"], "gpu": gpu, "git_sha": sha,
           "status": status, **counts, "total": len(results),
           "build_seconds": None if build_seconds is None else round(build_seconds, 1), "checks": results}
    if not build_ok:
        doc["build_log_tail"] = build_log.strip().splitlines()[-60:]
    return doc


def print_summary(doc):
    print(f"lab {doc['exercise']}: {doc['title']} ({doc['stage']}) on {doc['gpu']}")
    if doc["status"] == "build_failed":
        print("\n".join(doc["build_log_tail"]))
        print(f"0 / {doc['total']} passed: the lab does not build")
        return
    for r in doc["checks"]:
        tag = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}[r["status"]]
        print(f"  {tag}  {r['name']:<14} {r['detail']} ({r['seconds']:.1f} s)")
        if r["status"] == "failed":
            print(f"        hint: {r['hint']}")
    line = f"{doc['passed']} / {doc['total']} passed"
    if doc["failed"]:
        line += f", {doc['failed']} failed"
    if doc["skipped"]:
        line += f", {doc['skipped']} skipped"
    print(line)


def check_tree(ex_id, source, build, arch=None, timeout=None, quiet=False):
    table = load_table(source)
    ex = exercise(table, ex_id)
    timeout = timeout or int(ex.get("check_timeout", 300))
    ok, seconds, log = build_lab(source, build, ex, arch)
    if not quiet:
        print(f"lab {ex_id}: built in {seconds:.1f} s ({build})" if ok else f"lab {ex_id}: the build failed")
    if not ok:
        results = [{"name": c["name"], "status": "failed", "seconds": 0.0, "detail": "the lab does not build",
                    "hint": "Fix the compiler errors above first."} for c in resolved_checks(table, ex)]
        return summary(ex, results, build_seconds=seconds, build_ok=False, build_log=log)
    results, gpu, sha = grade_checks(table, ex, build, timeout)
    return summary(ex, results, gpu, sha, build_seconds=seconds)


def exit_code(doc):
    return {"passed": 0, "skipped": SKIP_RC}.get(doc["status"], 1)


def cmd_check(args):
    source = Path(args.source).resolve() if args.source else REPO
    build = Path(args.build_dir or f"build-lab-{args.id}").resolve()
    doc = check_tree(args.id, source, build, args.arch, args.timeout)
    print_summary(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return exit_code(doc)


def cmd_grade(args):
    table = load_table()
    ex = exercise(table, args.id)
    work = Path(args.work or f"grade-lab-{args.id}").resolve()
    tree = make_copy(args.id, work / "tree", quiet=True)
    files = sorted({r["file"] for r in ex["regions"]})
    docs = []
    for sub in args.submissions:
        sub = Path(sub)
        missing = [f for f in files if not (sub / f).is_file()]
        if missing:
            why = f"missing in the submission: {', '.join(missing)}"
            doc = summary(ex, [{"name": c["name"], "status": "failed", "seconds": 0.0, "detail": why,
                                "hint": "Submit the files that hold the exercise's regions."}
                               for c in resolved_checks(table, ex)], build_ok=False, build_log=why)
        else:
            for f in files:
                write_if_changed(tree / f, (sub / f).read_bytes())
            doc = check_tree(args.id, tree, work / "build", args.arch, args.timeout, quiet=True)
        doc["submission"] = str(sub)
        docs.append(doc)
        print(f"{sub}: {doc['passed']} / {doc['total']} passed ({doc['status']})", flush=True)
    Path(args.json).write_text(json.dumps({"exercise": ex["id"], "files": files, "results": docs}, indent=2,
                                          ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


# ---------------------------------------------------------------- verify

def verify(root=REPO):
    """What is wrong with the table and the markers (a list; empty when all is well)."""
    table = load_table(root)
    kinds = table.get("check_kinds", {})
    errors = []
    ids = [ex.get("id") for ex in table["exercises"]]
    if len(set(ids)) != len(ids):
        errors.append(f"exercise ids repeat: {ids}")
    declared = {}
    for ex in table["exercises"]:
        where, before = f"exercise {ex.get('id')}", len(errors)
        for key in ("id", "title", "rung", "min_sm", "status"):
            if key not in ex:
                errors.append(f"{where}: no '{key}'")
        if ex.get("status") not in ("ready", "planned"):
            errors.append(f"{where}: status must be ready or planned")
        for p in ex.get("prerequisites", []):
            if p not in ids:
                errors.append(f"{where}: unknown prerequisite {p}")
        if ex.get("status") != "ready":
            continue
        for key in ("stage", "rungs", "minutes", "text", "regions", "checks", "stub_fails"):
            if key not in ex:
                errors.append(f"{where}: no '{key}'")
        if len(errors) > before:
            continue
        for rung in ex["rungs"]:
            if not (root / rung / "CMakeLists.txt").is_file():
                errors.append(f"{where}: rung directory {rung} has no CMakeLists.txt")
        if ex["rung"] not in ex["rungs"]:
            errors.append(f"{where}: its rung {ex['rung']} is not among the rungs it builds")
        if not any(f'"{ex["stage"]}"' in p.read_text(errors="replace")
                   for rung in ex["rungs"] for p in (root / rung).glob("*") if p.suffix in SOURCE_SUFFIXES):
            errors.append(f"{where}: no rung it builds registers the stage \"{ex['stage']}\"")
        if not (root / ex["text"]).is_file():
            errors.append(f"{where}: {ex['text']} does not exist")
        names = []
        for c in ex["checks"]:
            kind = c.get("kind", c.get("name"))
            names.append(c.get("name"))
            if kind not in kinds:
                errors.append(f"{where}: check {c.get('name')} of unknown kind {kind}")
        if len(set(names)) != len(names):
            errors.append(f"{where}: check names repeat")
        for n in ex["stub_fails"]:
            if n not in names:
                errors.append(f"{where}: stub_fails names {n}, which is not one of its checks")
        if not ex["regions"]:
            errors.append(f"{where}: no regions")
        for name, values in ex.get("build", {}).items():  # LAB_<name>, read by a rung's CMakeLists.txt
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not isinstance(values, list):
                errors.append(f"{where}: build entry {name} must be an identifier and a list")
            elif not any(f"LAB_${{list}}" in (root / rung / "CMakeLists.txt").read_text() and name in
                         (root / rung / "CMakeLists.txt").read_text() for rung in ex["rungs"]):
                errors.append(f"{where}: build entry {name} is a list in none of its rungs' CMakeLists.txt")
        if ex.get("probe") and not (root / ex["probe"]).is_file():
            errors.append(f"{where}: probe {ex['probe']} does not exist")
        for f in ex.get("withhold", []):  # files the copy leaves out (make); lab.py ci proves the build needs none
            if not (root / f).is_file():
                errors.append(f"{where}: withholds {f}, which is not a file of the repository")
            elif f in {r.get("file") for r in ex["regions"]} or f == ex.get("probe"):
                errors.append(f"{where}: withholds {f}, which holds one of its regions or its probe")
            elif f.split("/")[0] in ("lab", "scripts", "cmake", "common", "bench", "ladder") or f.endswith(
                    ("CMakeLists.txt", ".cmake", ".md")):
                errors.append(f"{where}: withholds {f}: the lab build, its tools and its lessons need it; "
                              "withhold a rung's kernel file instead")
        for r in ex["regions"]:
            for key in ("name", "file", "task", "stub", "hints", "forbidden"):
                if not r.get(key):
                    errors.append(f"{where}: region {r.get('name')} has no {key}")
            if len(r.get("hints", [])) != 3:  # LABS.md, "Hints in tiers"
                errors.append(f"{where}: region {r.get('name')} must have 3 hint tiers (the idea, where and how, "
                              "the formulas)")
            if not str(r.get("name", "")).startswith(ex["id"] + "."):
                errors.append(f"{where}: region {r.get('name')} must be named {ex['id']}.<something>")
            if r.get("file", "").split("/")[0] not in ex["rungs"]:
                errors.append(f"{where}: region {r.get('name')} is in {r.get('file')}, outside the rungs it builds")
            if r.get("name") in declared:
                errors.append(f"region {r.get('name')} is declared twice")
            declared[r.get("name")] = r.get("file")
    regions, marker_errors = scan_tree(root)
    errors += marker_errors
    found = {}
    for r in regions:
        if r.name in found:
            errors.append(f"{r.file}:{r.begin}: region {r.name} also at {found[r.name].file}:{found[r.name].begin}")
        found[r.name] = r
        if r.name not in declared:
            errors.append(f"{r.file}:{r.begin}: region {r.name} is in no exercise of {TABLE}")
        elif declared[r.name] != r.file:
            errors.append(f"{r.file}:{r.begin}: region {r.name} is declared in {declared[r.name]}")
    for name, file in declared.items():
        if name not in found:
            errors.append(f"{TABLE}: region {name} not found in {file} (no LAB:BEGIN {name})")
    return errors, regions


def cmd_verify(args):
    errors, regions = verify(Path(args.source).resolve())
    table = load_table(Path(args.source).resolve())
    if errors:
        print("\n".join(f"lab verify: {e}" for e in errors), file=sys.stderr)
        return 1
    files = {r.file for r in regions}
    print(f"lab verify: {len(table['exercises'])} exercises ({len(ready_exercises(table))} ready), "
          f"{len(regions)} regions in {len(files)} files: markers balanced, named and declared")
    return 0


# ---------------------------------------------------------------- audit (no GPU)

LINK = re.compile(r"\]\(([^)#\s]+)#L(\d+)\)")


def squeeze(text):
    """text without white space, in one spelling of the symbols that code comments write in ASCII."""
    for a, b in (("−", "-"), ("ℓ", "l"), ("·", ""), ("̃", "~")):
        text = text.replace(a, b)
    return re.sub(r"\s+", "", text)


# What audit reads in a student copy for the regions' answers: every source, build and script
# file (the region files, the other step files, the harness, the tests, the scripts), the
# sheets (lab/text/*.md) and EXERCISE.md. The lessons (the rungs' .md, README.md, LABS.md) may
# print the algorithm, and are not read; the copy's table holds the forbidden expressions
# base64-encoded and is read as text (cmd audit).
AUDIT_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c", ".in", ".cmake", ".py", ".sh"}
AUDIT_NAMES = {"CMakeLists.txt", "EXERCISE.md"}


def audited(rel):
    return (Path(rel).suffix in AUDIT_SUFFIXES or Path(rel).name in AUDIT_NAMES
            or (rel.startswith("lab/text/") and rel.endswith(".md")))


def squeezed_lines(lines, skip=()):
    """The file's text squeezed (squeeze()), the lines in skip ((begin, end), 1-based, inclusive)
    left out, and for each character of it the line it comes from: (text, line of each char)."""
    text, where = [], []
    for n, line in enumerate(lines, 1):
        if any(b <= n <= e for b, e in skip):
            continue
        s = squeeze(line)
        text.append(s)
        where += [n] * len(s)
    return "".join(text), where


def squeezed_comments(lines, rel, skip=()):
    """The file's comments (// in C, CUDA and .in files, # in Python, shell and CMake), squeezed,
    consecutive comment lines joined (so that a formula broken over two comment lines is found),
    the lines in skip left out: (text, line of each char), like squeezed_lines. A line without a
    comment breaks the text with a character no expression contains."""
    marker = "#" if Path(rel).suffix in {".py", ".sh", ".cmake"} or Path(rel).name == "CMakeLists.txt" else "//"
    text, where = [], []
    for n, line in enumerate(lines, 1):
        k = line.find(marker)
        if k < 0 or any(b <= n <= e for b, e in skip):
            text.append("\0")
            where.append(n)
            continue
        c = squeeze(line[k + len(marker):])
        text.append(c)
        where += [n] * len(c)
    return "".join(text), where


def found_at(key, text, where):
    """The lines at which key starts in a squeezed text (squeezed_lines, squeezed_comments)."""
    lines, k = set(), text.find(key)
    while k >= 0:
        lines.add(where[k])
        k = text.find(key, k + 1)
    return lines


def audit_exercise(table, ex, work, root=REPO):
    """What a student copy of ex gives away or breaks: (errors, notes). A copy must not hold the
    reference's key expressions of a region (its `forbidden` list) in the stub, in the copy's
    table, in hint tiers 1 and 2, or anywhere in a file that audited() names (every source,
    header, build and script file, code or comment, the sheets and EXERCISE.md: the other
    step files of a rung, which hold the same functions written out, included; the exercise's
    `withhold` leaves such files out of the copy); a known leak listed in `leaks_pending` is
    reported, not failed. The regions keep their line numbers, so every lesson's file:line link
    into a region file shows the same line as in the reference (outside the stubbed regions), and
    no lesson links a file the copy lacks."""
    errors, notes = [], []
    copy = make_copy(ex["id"], work / ex["id"], root=root, quiet=True)
    where = f"lab {ex['id']}"
    pending = {(p["file"], squeeze(p["text"])): p for p in ex.get("leaks_pending", [])}
    seen_pending = set()
    files = sorted({r["file"] for r in ex["regions"]})
    stubbed_ranges = {}
    for rel in files:
        ref, stu = read_lines(root / rel), read_lines(copy / rel)
        if len(ref) != len(stu):
            errors.append(f"{where}: {rel} has {len(stu)} lines in the copy, {len(ref)} in the reference")
        ref_regions = {r.name: r for r in scan_lines(ref, rel)[0]}
        stu_regions = {r.name: r for r in scan_lines(stu, rel)[0]}
        for spec in ex["regions"]:
            if spec["file"] != rel:
                continue
            a, b = ref_regions.get(spec["name"]), stu_regions.get(spec["name"])
            if not a or not b or (a.begin, a.end) != (b.begin, b.end):
                errors.append(f"{where}: region {spec['name']} moved: reference "
                              f"{a and (a.begin, a.end)}, copy {b and (b.begin, b.end)}")
        stubbed_ranges[rel] = [(r.begin, r.end) for r in ref_regions.values()
                               if r.name in {s["name"] for s in ex["regions"]}]
    # The lessons' links into the region files.
    links = 0
    for md in sorted(copy.rglob("*.md")):
        for m in LINK.finditer(md.read_text(encoding="utf-8", errors="replace")):
            target = (md.parent / m.group(1)).resolve()
            try:
                rel = target.relative_to(copy).as_posix()
            except ValueError:
                continue
            if rel not in files:
                continue
            line, ref, stu = int(m.group(2)), read_lines(root / rel), read_lines(copy / rel)
            links += 1
            if any(b <= line <= e for b, e in stubbed_ranges[rel]):
                continue  # a link into the region: the stub, as it should
            if line > len(stu) or line > len(ref) or ref[line - 1] != stu[line - 1]:
                errors.append(f"{where}: {md.relative_to(copy)} links {rel}:{line}, which shows another line "
                              "in the copy than in the reference")
    # No link of the copy's .md files names a file or directory that the reference has and the copy
    # lacks (make turns links into withheld files into plain text).
    for md in sorted(copy.rglob("*.md")):
        rel_md = md.relative_to(copy).as_posix()
        for m in MD_LINK.finditer(md.read_text(encoding="utf-8", errors="replace")):
            target = link_target(rel_md, m.group(3))
            if target and not (copy / target).exists() and (root / target).exists():
                errors.append(f"{where}: {rel_md} links {m.group(3)}, which the copy does not hold")
    # And the lessons' link rules of scripts/check_docs.py (a file that exists, a line that shows
    # the symbol the link names), run on the copy.
    docs = copy / "scripts" / "check_docs.py"
    if docs.is_file():
        spec = importlib.util.spec_from_file_location(f"check_docs_{ex['id']}", docs)
        check_docs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(check_docs)
        check_docs.REPO = copy
        errors += [f"{where}: in the copy, broken link {b}" for b in check_docs.broken_links()]
        errors += [f"{where}: in the copy, link to the wrong line: {b}" for b in check_docs.misnamed_links()]
    # The answers: in the copy's table, the hints of tiers 1 and 2 and the stubs, and in every
    # file of the copy that audited() names (code and comments alike, outside the stubs).
    texts = [(TABLE.as_posix() + " (the copy's)", (copy / TABLE).read_text(encoding="utf-8"))]
    for spec in ex["regions"]:
        for k, h in enumerate(spec["hints"][:2], 1):
            texts.append((f"hint tier {k} of {spec['name']}", hint_text(h)))
    for rel in files:
        stu = read_lines(copy / rel)
        for r in scan_lines(stu, rel)[0]:
            if r.name in {s["name"] for s in ex["regions"]}:
                texts.append((f"the stub of {r.name} ({rel}:{r.begin})", "".join(stu[r.begin - 1:r.end])))
    keys = []
    for spec in ex["regions"]:
        reference = squeeze("".join(read_lines(root / spec["file"])) + hint_text(spec["hints"][-1]))
        for bad in spec.get("forbidden", []):
            key = squeeze(bad)
            keys.append((spec, bad, key))
            if key not in reference:
                errors.append(f"{where}: forbidden text of {spec['name']} is neither in {spec['file']} nor in its "
                              f"last hint, so it guards nothing: {bad!r}")
            for what, text in texts:
                if key in squeeze(text):
                    errors.append(f"{where}: {what} gives {spec['name']}'s answer away: {bad!r}")
    scanned = 0
    for rel in tree_files(copy):
        if not audited(rel) or rel == TABLE.as_posix():
            continue
        try:
            lines = read_lines(copy / rel)
        except UnicodeDecodeError:
            continue
        scanned += 1
        skip = stubbed_ranges.get(rel, ())
        code, comments = squeezed_lines(lines, skip), squeezed_comments(lines, rel, skip)
        for spec, bad, key in keys:
            for line in sorted(found_at(key, *code) | found_at(key, *comments)):
                if (rel, key) in pending:
                    seen_pending.add((rel, key))
                    notes.append(f"{where}: {rel}:{line} still states {bad!r} "
                                 f"(pending: {pending[(rel, key)]['why']})")
                else:
                    errors.append(f"{where}: {rel}:{line} gives {spec['name']}'s answer away: {bad!r}")
    for (rel, key), p in pending.items():
        if (rel, key) not in seen_pending:
            errors.append(f"{where}: leaks_pending lists {p['text']!r} in {rel}, which that file no longer "
                          "states: remove the entry")
    notes.append(f"{where}: {len(files)} region file(s) keep their line count; {links} lesson links into them "
                 f"checked; {len(keys)} forbidden expressions looked for in {scanned} files")
    return errors, notes


def cmd_audit(args):
    table = load_table()
    ids = args.ids or [ex["id"] for ex in ready_exercises(table)]
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for ex_id in ids:
            e, notes = audit_exercise(table, exercise(table, ex_id), Path(tmp))
            errors += e
            print("\n".join(notes))
    if errors:
        print("\n".join(f"lab audit: {e}" for e in errors), file=sys.stderr)
        return 1
    print(f"lab audit: {len(ids)} student copies give no region's answer away and keep the lessons' links")
    return 0


# ---------------------------------------------------------------- ci and selftest

def cmd_ci(args):
    errors, _ = verify()
    if errors:
        print("\n".join(f"lab verify: {e}" for e in errors), file=sys.stderr)
        return 1
    if cmd_audit(argparse.Namespace(ids=args.ids)):
        return 1
    table = load_table()
    work = Path(args.work).resolve()
    has_gpu = detect_arch(80) is not None
    if has_gpu and args.skip_with_gpu:  # CTest lab_stubs: its point is the grader's skip without a GPU
        print(f"lab ci: skipped: a GPU is here, so the graders would not be asked to skip; "
              f"'scripts/lab.py selftest' builds and grades every lab on it (CI, without a GPU, runs this)")
        return SKIP_RC
    ids = args.ids or [ex["id"] for ex in ready_exercises(table)]
    failed, total = [], time.monotonic()
    for ex_id in ids:
        ex = exercise(table, ex_id)
        start = time.monotonic()
        src = make_copy(ex_id, work / ex_id / "src", quiet=True)
        ok, seconds, log = build_lab(src, work / ex_id / "build", ex, args.arch or "90a", args.jobs)
        note = ""
        if ok and not has_gpu:  # no GPU: every check must report skipped (exit 77), never passed
            rc, out = run_logged([str(work / ex_id / "build" / GRADER)])
            if rc != SKIP_RC:
                ok, log = False, f"without a GPU the grader must skip (exit {SKIP_RC}), got exit {rc}:\n{out}"
            note = ", grader skips without a GPU"
        print(f"lab {ex_id}: student copy {'builds' if ok else 'FAILS'} "
              f"({seconds:.0f} s to configure and build, {time.monotonic() - start:.0f} s in all{note})", flush=True)
        if not ok:
            print("\n".join(log.strip().splitlines()[-40:]))
            failed.append(ex_id)
    print(f"lab ci: {len(ids) - len(failed)} / {len(ids)} labs build from their stubs in "
          f"{time.monotonic() - total:.0f} s")
    return 1 if failed else 0


def cmd_selftest(args):
    table = load_table()
    work = Path(args.work).resolve()
    ids = args.ids or [ex["id"] for ex in ready_exercises(table)]
    lines, ok_all, gpu = [], True, "none"

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    log(f"lab selftest, {time.strftime('%Y-%m-%d %H:%M:%S')}, commit {source_sha()}")
    if detect_arch(80) is None:
        print("lab selftest: no GPU found (nvidia-smi): every check will skip; only the builds are tested")
    for ex_id in ids:
        ex = exercise(table, ex_id)
        ref = check_tree(ex_id, REPO, work / f"ref-{ex_id}", args.arch, args.timeout, quiet=True)
        gpu = ref["gpu"] if ref["gpu"] != "none" else gpu
        src = make_copy(ex_id, work / f"student-{ex_id}" / "src", quiet=True)
        stu = check_tree(ex_id, src, work / f"student-{ex_id}" / "build", args.arch, args.timeout, quiet=True)
        failing = [r["name"] for r in stu["checks"] if r["status"] == "failed"]
        unseen = [r["name"] for r in stu["checks"] if r["status"] == "skipped" and r["name"] in ex["stub_fails"]]
        missing = [n for n in ex["stub_fails"] if n not in failing and n not in unseen]  # passed, yet a stub
        ref_ok = ref["status"] == "passed"
        stu_ok = stu["status"] == "failed" and not missing
        # A one-line edit in the student's first region, then the rebuild.
        spec = ex["regions"][0]
        path = src / spec["file"]
        text = read_lines(path)
        begin = next(r.begin for r in scan_lines(text, spec["file"])[0] if r.name == spec["name"])
        text.insert(begin, "// a one-line edit (lab selftest)\n")
        path.write_text("".join(text), encoding="utf-8")
        ok, rebuild, _ = build_lab(src, work / f"student-{ex_id}" / "build", ex, args.arch)
        ok_all &= ref_ok and stu_ok and ok
        log(f"lab {ex_id} ({ex['stage']}):")
        log(f"  reference: {ref['status']}, {ref['passed']} / {ref['total']} passed"
            + (f", skipped: {', '.join(r['name'] for r in ref['checks'] if r['status'] == 'skipped')}"
               if ref["skipped"] else "") + f"; build {ref['build_seconds']} s  [{'ok' if ref_ok else 'WRONG'}]")
        log(f"  stubs:     {stu['status']}, {stu['passed']} / {stu['total']} passed; failing: "
            f"{', '.join(failing) or 'none'}; expected at least: {', '.join(ex['stub_fails'])}"
            + (f" (skipped here: {', '.join(unseen)})" if unseen else "") + f"  [{'ok' if stu_ok else 'WRONG'}]")
        log(f"  rebuild after a one-line edit of {spec['file']}: {rebuild:.1f} s" + ("" if ok else " (FAILED)"))
        for name, doc in (("reference", ref), ("stubs", stu)):
            for r in doc["checks"]:
                log(f"    {name:<9} {r['status']:<7} {r['name']:<14} {r['detail']}")
    log(f"lab selftest: {'ok' if ok_all else 'FAILED'} on {gpu}")
    path = Path(args.log) if args.log else REPO / "results" / gpu / "labs.log"
    lines[0] += f", GPU {gpu}"
    merge_log(path, lines, [ex["id"] for ex in ready_exercises(table)])
    print(f"log: {path}")
    return 0 if ok_all else 1


def merge_log(path, lines, order):
    """Writes this run's exercise sections into the log, keeping the other exercises' sections
    from earlier runs (a selftest may run a few exercises at a time)."""
    def sections(text_lines):
        out, current = {}, None
        for line in text_lines:
            m = re.match(r"lab (\S+) \(", line)
            if m:
                current = m.group(1)
                out[current] = []
            elif line.startswith("lab selftest"):
                current = None
            if current:
                out[current].append(line)
        return out

    old = sections(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else {}
    new = sections(lines)
    old.update(new)
    body = [line for ex_id in order if ex_id in old for line in old[ex_id]]
    bad = any("[WRONG]" in line or "(FAILED)" in line for line in body)
    footer = f"lab selftest: {'FAILED' if bad else 'ok'} for {', '.join(i for i in order if i in old)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines[:1] + body + [footer]) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="the exercises")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("make", help="a student copy with one exercise's regions stubbed")
    p.add_argument("id")
    p.add_argument("--out", required=True)
    p.add_argument("--only-needed", action="store_true", help="leave out the rung directories the lab does not build")
    p.set_defaults(fn=cmd_make)
    p = sub.add_parser("hint", help="one tier of an exercise's hints (1: the idea, 2: where and how, 3: formulas)")
    p.add_argument("id")
    p.add_argument("region", nargs="?", help="one region (its name, or the part after the dot); default: all")
    p.add_argument("--tier", type=int, default=1, choices=(1, 2, 3))
    p.add_argument("--source", help="the tree whose table to read (default: the one holding this script)")
    p.set_defaults(fn=cmd_hint)
    for name, fn, helptext in (("check", cmd_check, "build the lab and run its grader"),
                               ("grade", cmd_grade, "grade several submissions")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("id")
        if name == "check":
            p.add_argument("--json")
            p.add_argument("--build-dir")
            p.add_argument("--source", help="the tree to build (default: the one holding this script)")
        else:
            p.add_argument("submissions", nargs="+", help="directories, each a student's copy")
            p.add_argument("--json", required=True)
            p.add_argument("--work", help="the grading tree and its build (default ./grade-lab-ID)")
        p.add_argument("--arch", help="CMAKE_CUDA_ARCHITECTURES (default: the GPU's, else 90a)")
        p.add_argument("--timeout", type=int, help="seconds per check (default: the exercise's check_timeout, "
                                                  "else 300)")
        p.set_defaults(fn=fn)
    p = sub.add_parser("verify", help="markers and table consistent (no GPU)")
    p.add_argument("--source", default=str(REPO))
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("audit", help="each student copy: no answer in it, lesson links right (no GPU)")
    p.add_argument("--ids", nargs="*")
    p.set_defaults(fn=cmd_audit)
    p = sub.add_parser("ci", help="verify; make, configure and build every exercise (no GPU)")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "attn-lab-ci"))
    p.add_argument("--ids", nargs="*")
    p.add_argument("--arch", help="CMAKE_CUDA_ARCHITECTURES (default 90a)")
    p.add_argument("-j", "--jobs", type=int)
    p.add_argument("--skip-with-gpu", action="store_true",
                   help=f"exit {SKIP_RC} (skipped) where a GPU is found: the graders' skip can only be tested without one")
    p.set_defaults(fn=cmd_ci)
    p = sub.add_parser("selftest", help="on a GPU: stubs fail, references pass, rebuild times")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "attn-lab-selftest"))
    p.add_argument("--ids", nargs="*")
    p.add_argument("--log", help="default results/<gpu>/labs.log")
    p.add_argument("--arch")
    p.add_argument("--timeout", type=int, help="seconds per check (default: each exercise's check_timeout)")
    p.set_defaults(fn=cmd_selftest)
    p = sub.add_parser("config", help="what a lab build needs (cmake/lab.cmake)")
    p.add_argument("id")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_config)
    args = ap.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()

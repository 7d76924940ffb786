"""CPU tests of scripts/check_docs.py's rules: which symbol a file:line link names, whether
the linked lines show it, and the box every lesson opens with. Run by CTest (docs_rules)
and by `python3 -m pytest tests/python/test_check_docs.py`. No GPU, no build."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import check_docs  # noqa: E402

SOURCE = """\
#include "model.h"

double score_bytes(int n) {
  return 2.0 * n;
}

double softmax_bytes(int n) {
  return 4.0 * n;
}
"""


@pytest.mark.parametrize("text, before, symbol", [
    # the link text is the symbol
    ("`softmax_bytes`", "see ", "softmax_bytes"),
    ("hbm::softmax_bytes(p, 2)", "", "softmax_bytes"),
    ("`Stage::prev`", "", "prev"),
    # a file:line text takes the code span right before it
    ("`model.cpp:7`", "the softmax is `softmax_bytes` ", "softmax_bytes"),
    ("`model.cpp:7`", "`hbm::softmax_bytes(p, 2)` (", "softmax_bytes"),
    ("`model.cpp:7`", "walk `for_each_chunk`,\n", "for_each_chunk"),
    ("`model.cpp:7`", "| 3 | `row_sum<T>` ", "row_sum"),
    # ... but not across prose, two separators or two line breaks
    ("`model.cpp:7`", "`softmax_bytes` is at ", None),
    ("`model.cpp:7`", "`softmax_bytes`, (", None),
    ("`model.cpp:7`", "`softmax_bytes`\n\n", None),
    ("`model.cpp:7`", "splits (", None),
    # a code span that is not a name names nothing
    ("`model.cpp:7`", "`subtract_max = false` ", None),
    ("`model.cpp:7`", "`m_i = −∞` ", None),
    # prose link texts name nothing
    ("the loop", "", None),
    ("model.cpp", "`softmax_bytes` ", "softmax_bytes"),
])
def test_link_symbol(text, before, symbol):
    assert check_docs.link_symbol(text, before) == symbol


def test_symbol_near_uses_a_two_line_window_and_whole_words():
    lines = SOURCE.splitlines()  # softmax_bytes on line 7, score_bytes on line 3
    assert check_docs.symbol_near(lines, 7, "softmax_bytes")
    assert check_docs.symbol_near(lines, 5, "softmax_bytes")      # 7 is within 5 + 2
    assert not check_docs.symbol_near(lines, 4, "softmax_bytes")  # 7 is past 4 + 2
    assert not check_docs.symbol_near(lines, 7, "softmax")        # a part of a word is not the name


def test_misnamed_links_flags_only_links_whose_lines_lack_the_named_symbol(tmp_path):
    (tmp_path / "model.cpp").write_text(SOURCE)
    md = tmp_path / "README.md"
    md.write_text(
        "Right: `softmax_bytes` ([`model.cpp:7`](model.cpp#L7)) and [`score_bytes`](model.cpp#L3).\n"
        "Wrong: `softmax_bytes` ([`model.cpp:3`](model.cpp#L3)), [`score_bytes`](model.cpp#L9).\n"
        "Named nowhere: the split count ([`model.cpp:1`](model.cpp#L1)).\n")
    bad = check_docs.misnamed_links_in(md)
    assert len(bad) == 2, bad
    assert "README.md:2: model.cpp#L3 does not show `softmax_bytes`" in bad[0]
    assert "model.cpp#L9 does not show `score_bytes`" in bad[1]


def box(gpu="> **GPU:** sm_80+\\", run="> **Run:** `build/bench/attn_bench --rungs 02_x,01_x --check`\\",
        lab="> **Lab:** 02 ([LABS.md](../LABS.md))"):
    return f"# 02 — a lesson\n\n{gpu}\n{run}\n{lab}\n\n## The idea\n"


STAGES, LABS = {"01_x", "02_x"}, {"01", "02"}


def test_box_accepts_a_complete_box():
    assert check_docs.box_problems(box(), STAGES, LABS) == []
    assert check_docs.box_problems(box(lab="> **Lab:** none (the lab is on 02)"), STAGES, LABS) == []
    assert check_docs.box_problems(box(lab="> **Lab:** 01, 02"), STAGES, LABS) == []


@pytest.mark.parametrize("lesson, complaint", [
    ("# 02 — a lesson\n\n## The idea\n", "line 1 must start with '> **GPU:**'"),
    (box(gpu="> GPU: sm_80+\\"), "line 1 must start"),
    (box(gpu="> **GPU:** sm_80+"), "must end with '\\'"),
    (box(run="> **Run:** `attn_bench --rungs 02_x`\\"), "attn_bench --rungs <this>,<below> --check"),
    (box(run="> **Run:** `build/bench/attn_bench --rungs 02_x,01_y --check`\\"), "names 01_y"),
    (box(lab="> **Lab:** 07"), "lab 07"),
    (box(lab="> **Lab:** (none)"), "lab ids or 'none'"),
])
def test_box_rejects(lesson, complaint):
    problems = check_docs.box_problems(lesson, STAGES, LABS)
    assert any(complaint in p for p in problems), problems


def test_the_repository_passes_its_own_rules():
    assert check_docs.missing_boxes() == []
    assert check_docs.misnamed_links() == []

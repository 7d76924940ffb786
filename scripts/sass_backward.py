#!/usr/bin/env python3
"""Checks in the SASS what 06_fa3_hopper/06i_bwd.md, 06k_bwd.md, 06l_bwd.md, 06n_bwd.md,
06p_bwd.md and 06q_bwd.md say of the backward steps 06h-06q.

For each fa3_backward kernel of 06h-06q (every head dim and dtype built):
  generic     plain loads and stores of shared memory through a generic pointer (`LD.E`,
              `ST.E`, not `LDS`/`STS`/`LDG`/`STG`). 06h has them (aligned_shared's integer
              round trip, the pitfall 06i removes); 06i-06q must have none.
  pipelined   every wgmma group (a run of HGMMA ending with the one that carries `gsb0`)
              holds more than one HGMMA: when ptxas serializes a kernel's wgmmas (a wait
              inside a branch, too few registers) each HGMMA becomes a group of its own.
  06j order   the loop issues, in address order, Sᵀ and dPᵀ (SS), dV (RS), dQ_i (SS), dK (RS);
              the first wait after dV leaves one group pending (dPᵀ done, dV in flight); the
              first wait after dK leaves one pending (dQ_i done, dK in flight), and the dQ_i
              stores (`STS.64`) come before the wait for dK. 06k at d = 128: the same.
  06k at d = 64 the same issue order, but dV goes after dSᵀ (128-row steps): no wait between
              dV's issue and dQ_i's (dV runs under the dSᵀ stores and the barrier); dK as 06j.
              06l-06q: 06k's order at both head dims; 06n's-06q's Sᵀ at d = 64 is an
              RS group (K_j from registers), so their order there begins RS SS RS SS RS.
  epilogue    06k stores dK_j, dV_j from registers (`STG`); 06l-06q have no `STG` at
              all and store them by TMA (`UTMASTG`); 06o's-06q's pieces' instance
              (kPieces) adds them by bulk reductions (`UBLKRED`, with dQ_i's), no
              `UTMASTG`, no `STG`.
  06p         at d = 128 the consumers arrive at the dQ barrier (`BAR.ARV`), the writer warp
              waits there; at d = 64 each kernel is 06o's, instruction for instruction.
  06q         at d = 128 each kernel is 06p's, instruction for instruction; at d = 64 the
              whole tiles' kernel takes tiles from the counter (one `ATOMG`).
Exit 0: all hold; 1: a violation; 77 (CTest: skipped): no cuobjdump, or a library built
without these steps (a lab build).

    scripts/sass_backward.py build/libattn_ladder.so
"""

import argparse
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sass_order import SKIP, WAIT, find_cuobjdump, functions, groups, sass_of_binary  # noqa: E402

STEPS = {"06h": ("06h_bwd", False), "06i": ("06i_bwd", True), "06j": ("06j_bwd", True),
         "06k": ("06k_bwd", True), "06l": ("06l_bwd", True), "06m": ("06m_bwd", True),
         "06n": ("06n_bwd", True), "06o": ("06o_bwd", True),
         "06p": ("06p_bwd", True), "06q": ("06q_bwd", True)}  # ELF name, must be LDS/STS
STG = re.compile(r"^(?:@!?U?P\w+\s+)?STG\b")
TMA_STORE = re.compile(r"^(?:@!?U?P\w+\s+)?UTMASTG\b")
BULK_ADD = re.compile(r"^(?:@!?U?P\w+\s+)?UBLKRED\b")
GENERIC = re.compile(r"^(?:@!?U?P\w+\s+)?(?:LD|ST)\.E\b")
BAR_ARRIVE = re.compile(r"^(?:@!?U?P\w+\s+)?BAR\.ARV\b")
ATOMIC = re.compile(r"^(?:@!?U?P\w+\s+)?ATOMG\b")


def generic_count(code):
    return sum(1 for _, t in code if GENERIC.match(t))


def check_06j_order(code, lines, early_dv=True, s_kind="SS"):
    gs = groups(code)
    kinds = [g["kind"] for g in gs]
    order = [s_kind, "SS", "RS", "SS", "RS"]
    for k in range(len(gs) - 4):
        if kinds[k:k + 5] == order:
            dv, dq, dk = gs[k + 2], gs[k + 3], gs[k + 4]
            break
    else:
        lines.append(f"  VIOLATION: no {' '.join(order)} issue order (groups: {' '.join(kinds)})")
        return False
    ok = True

    def first_wait(after, before):
        for i in range(after + 1, before):
            w = WAIT.search(code[i][1])
            if w:
                return i, int(w.group(1), 16)
        return None, None

    def verdict(good, text):
        lines.append(f"  {'ok' if good else 'VIOLATION'}: {text}")
        return good

    _, pending = first_wait(dv["last"], dq["first"])
    if early_dv:
        ok &= verdict(pending == 1, f"after dV's issue the first wait leaves {pending} group(s) pending")
    else:
        ok &= verdict(pending is None, f"no wait between dV's issue and dQ_i's ({pending} pending at one)")
    i, pending = first_wait(dk["last"], len(code))
    ok &= verdict(pending == 1, f"after dK's issue the first wait leaves {pending} group(s) pending")
    if i is not None:
        j, last = first_wait(i, len(code))
        ops = [t.split()[1] if t.startswith("@") else t.split()[0] for _, t in code[i + 1:j or len(code)]]
        stores = sum(1 for op in ops if op.startswith("STS.64"))
        ok &= verdict(last == 0 and stores > 0, f"{stores} STS.64 (dQ_i) before the wait for dK (0x{last or 0:x})")
    return ok


def check_06p(name, code, sass_06o, lines):
    """d = 128: the dQ barrier is arrived at (`BAR.ARV`: the consumers, and the writer at the
    dSᵀ barrier); d = 64: the same instructions as 06o's kernel (no writer there)."""
    if "ILi64E" in name:
        twin = functions(sass_06o, re.escape(name.replace("step06p", "step06o"))).get(name.replace("step06p", "step06o"))
        good = twin is not None and [t for _, t in code] == [t for _, t in twin]
        lines.append(f"  {'ok' if good else 'VIOLATION'}: d = 64: {len(code)} instructions, 06o's kernel opcode for opcode")
        return good
    arrives = sum(1 for _, t in code if BAR_ARRIVE.match(t))
    lines.append(f"  {'ok' if arrives else 'VIOLATION'}: d = 128: {arrives} BAR.ARV (the dQ writer's barriers)")
    return arrives > 0


def check_06q(name, code, sass_06p, lines):
    """d = 128: the same instructions as 06p's kernel; d = 64, the whole tiles (kPieces =
    false): one atomic, the tile counter's."""
    if "ILi128E" in name:
        twin = functions(sass_06p, re.escape(name.replace("step06q", "step06p"))).get(name.replace("step06q", "step06p"))
        good = twin is not None and [t for _, t in code] == [t for _, t in twin]
        lines.append(f"  {'ok' if good else 'VIOLATION'}: d = 128: {len(code)} instructions, 06p's kernel opcode for opcode")
        return good
    if "Lb1E" in name:
        return True
    atoms = sum(1 for _, t in code if ATOMIC.match(t))
    lines.append(f"  {'ok' if atoms == 1 else 'VIOLATION'}: d = 64: {atoms} ATOMG (the tile counter's: 1 expected)")
    return atoms == 1


def check(sass_by_step):
    all_ok = True
    for step, sass in sass_by_step.items():
        must_be_shared = STEPS[step][1]
        kernels = functions(sass, rf"step{step}.*fa3_backward")
        if not kernels:
            print(f"{step}: no fa3_backward kernel found")
            all_ok = False
        for name, code in sorted(kernels.items()):
            lines = [name]
            n = generic_count(code)
            good = n == 0 if must_be_shared else n > 0
            want = "none" if must_be_shared else "some (the pitfall 06i removes)"
            lines.append(f"  {'ok' if good else 'VIOLATION'}: {n} generic LD.E/ST.E, {want} expected")
            ok = good
            gs = groups(code)
            single = sum(1 for g in gs if g["count"] == 1)
            good = bool(gs) and single == 0
            lines.append(f"  {'ok' if good else 'VIOLATION'}: {len(gs)} wgmma groups, {single} of a single HGMMA")
            ok &= good
            if step in ("06j", "06k", "06l", "06m", "06n", "06o", "06p", "06q"):
                k_held = step in ("06n", "06o", "06p", "06q") and "ILi64E" in name  # 06n_bwd.md: K_j in registers at d = 64
                ok &= check_06j_order(code, lines, early_dv=step == "06j" or "ILi128E" in name,
                                      s_kind="RS" if k_held else "SS")
            if step in ("06k", "06l", "06m", "06n", "06o", "06p", "06q"):
                stg = sum(1 for _, t in code if STG.match(t))
                tma = sum(1 for _, t in code if TMA_STORE.match(t))
                adds = sum(1 for _, t in code if BULK_ADD.match(t))
                pieces = step in ("06o", "06p", "06q") and "Lb1E" in name  # fa3_backward<D, T, kPieces = true>
                if step == "06k":
                    good, want = stg > 0 and tma == 0, "STG, no UTMASTG"
                elif pieces:  # dQ_i's add and the piece's dK, dV sums: bulk reductions only
                    good, want = stg == 0 and tma == 0 and adds >= 3, "3+ UBLKRED, no UTMASTG, no STG"
                else:
                    good, want = stg == 0 and tma > 0, "UTMASTG, no STG"
                lines.append(f"  {'ok' if good else 'VIOLATION'}: dK, dV: {stg} STG, {tma} UTMASTG, {adds} UBLKRED "
                             f"({want} expected)")
                ok &= good
            if step == "06p":
                ok &= check_06p(name, code, sass_by_step.get("06o", ""), lines)
            if step == "06q":
                ok &= check_06q(name, code, sass_by_step.get("06p", ""), lines)
            print("\n".join(lines))
            all_ok &= ok
    return all_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary", help="library .so, object or cubin with the backward kernels")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("skipped: no cuobjdump ($CUOBJDUMP, PATH, /usr/local/cuda/bin, the nvidia-cuda-cuobjdump wheel)")
        return SKIP
    sass_by_step = {}
    for step, (elf, _) in STEPS.items():
        sass = sass_of_binary(cuobjdump, args.binary, elf)
        if sass is None:
            print(f"skipped: no ELF image named *{elf}* in {args.binary} (a build without the backward steps?)")
            return SKIP
        sass_by_step[step] = sass
    ok = check(sass_by_step)
    print("06h-06q's SASS is as 06i_bwd.md, 06k_bwd.md, 06l_bwd.md, 06n_bwd.md, 06p_bwd.md and 06q_bwd.md say" if ok else "FAILED: see VIOLATION above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

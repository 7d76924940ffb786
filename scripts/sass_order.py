#!/usr/bin/env python3
"""Checks in the SASS that 06d's softmax really runs under its own P V (06_fa3_hopper/06d1.md).

FA3's intra-warpgroup overlap (paper §3.2): in block j a consumer warpgroup issues
S_next = Q_i K_jᵀ and O_i += P V_(j-1), waits for S_next only, and exponentiates S_next while
the P V is still on the tensor cores; only then does it wait for the P V. ptxas may hoist
that second wait above the softmax (it did at d <= 128), which the PTX does not show. This
script reads the SASS of every 06d kernel and checks where the wait landed.

What it looks for, in each kernel's instructions in address order:
  wgmma group   a run of HGMMA instructions that ends with the one carrying `gsb0` (the
                commit); SS when its A operand is a shared-memory descriptor
                (`HGMMA.64xNx16 Rd, gdesc[..], ..`), RS when A comes from registers
                (`HGMMA.64xNx16 Rd, Ra, gdesc[..], ..`).
  loop issue    an SS group followed by an RS group with no other HGMMA in between: the
                steady-state loop's S_next = Q K_jᵀ, then O_i += P V_(j-1).
  wait for S    the first `WARPGROUP.DEPBAR.LE gsb0, 0x1` after the RS group.
  wait for P V  the first `WARPGROUP.DEPBAR.LE gsb0, 0x0` after the RS group: the wait that
                retires P_(j-1) V_(j-1) (no other SASS waits for a wgmma).
  softmax       the `MUFU.EX2` instructions between the RS group and the wait for P V.
The overlap is real when that span holds at least N/2 MUFU.EX2, N being the SS GEMM's
width (B_c keys: N/2 scores per thread, one exponential each). Address order is the
fall-through order of the hot path (ptxas places the rare branches, such as the overflow
path, after it); the script prints the order it found so a reader can check.

Input: a binary with device code (the library .so, a .o or .cubin; cuobjdump is run on
the ELF images whose names contain --elf, default "06d_"), or a text dump of
`cuobjdump -sass` (--sass FILE, or - for stdin). Kernels: mangled names matching
--function (default: 06d's fa3_forward). Exit 0: every loop found keeps the order;
1: a violation, or no loop found; 77 (CTest: skipped): no cuobjdump (looked for in
$CUOBJDUMP, on PATH, in /usr/local/cuda/bin, from the nvidia-cuda-cuobjdump wheel), or a
binary without 06d.

    scripts/sass_order.py build/libattn_ladder.so
    cuobjdump -sass x.cubin | scripts/sass_order.py --sass -
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
HGMMA = re.compile(r"^(?:@!?U?P\w+\s+)?HGMMA\.64x(\d+)x\d+\S*\s+(\S+),\s*(\S+)")
WAIT = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")


def pip_cuobjdump():
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (scripts/install_deps.sh), if installed."""
    try:
        import nvidia  # the wheels' namespace package
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cu12", "cuda_cuobjdump"):
            path = os.path.join(root, sub, "bin", "cuobjdump")
            if os.path.isfile(path):
                return path
    return None


def find_cuobjdump():
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump",
                  pip_cuobjdump()]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def sass_of_binary(cuobjdump, binary, elf_filter):
    """cuobjdump -sass of the ELF images in `binary` whose names contain elf_filter (the one
    image of a lone .cubin or .o, whatever its name); None where a binary of several images
    has none of them (a build without 06d)."""
    listing = subprocess.run([cuobjdump, "-lelf", binary], capture_output=True, text=True, check=True).stdout
    images = re.findall(r"ELF file\s+\d+:\s+(\S+)", listing)
    names = [n for n in images if elf_filter in n]
    if not names:
        if len(images) > 1:
            return None
        return subprocess.run([cuobjdump, "-sass", binary], capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", ",".join(names), os.path.abspath(binary)], cwd=tmp, capture_output=True,
                       check=True)
        return "".join(
            subprocess.run([cuobjdump, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
            for f in sorted(pathlib.Path(tmp).iterdir()))


def functions(sass, name_filter):
    """{mangled name: [(address, instruction text)]} for the kernels matching name_filter."""
    out, current = {}, None
    for line in sass.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = m.group(1) if re.search(name_filter, m.group(1)) else None
            if current:
                out[current] = []
            continue
        m = INSTRUCTION.search(line)
        if m and current:
            out[current].append((int(m.group(1), 16), m.group(2)))
    return out


def groups(code):
    """wgmma groups: dicts with kind (SS/RS), n (the GEMM's N), first and last index, count."""
    found, start = [], None
    for i, (_, text) in enumerate(code):
        m = HGMMA.match(text)
        if not m:
            continue
        if start is None:
            start = i
        if "gsb0" in text:
            kind = "SS" if m.group(3).startswith("gdesc") else "RS"
            count = sum(1 for _, t in code[start:i + 1] if HGMMA.match(t))
            found.append({"kind": kind, "n": int(m.group(1)), "first": start, "last": i, "count": count})
            start = None
    return found


def short(text):
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= 60 else text[:57] + "..."


def check_loop(code, qk, pv):
    """The order after one loop issue (qk: SS group, pv: RS group): (ok, lines)."""
    exps = qk["n"] // 2
    lines = [f"  {code[qk['first']][0]:#07x}  S = Q K^T issue: {qk['count']} HGMMA 64x{qk['n']} (SS)",
             f"  {code[pv['first']][0]:#07x}  P V issue:      {pv['count']} HGMMA 64x{pv['n']} (RS)"]
    mufu_before, mufu_run = 0, None
    for i in range(pv["last"] + 1, len(code)):
        addr, text = code[i]
        if "MUFU.EX2" in text:
            mufu_before += 1
            if mufu_run is None:
                mufu_run = addr
            continue
        if HGMMA.match(text):
            lines.append(f"  {addr:#07x}  next HGMMA before any wait for the P V")
            return False, lines
        w = WAIT.search(text)
        if not w:
            continue
        if mufu_run is not None:
            lines.append(f"  {mufu_run:#07x}  MUFU.EX2 x {mufu_before}")
            mufu_run = None
        pending = int(w.group(1), 16)
        label = "wait for S (P V in flight)" if pending == 1 else "wait for the P V"
        lines.append(f"  {addr:#07x}  {short(text)}   <- {label}")
        if pending == 0:
            # Where the exponentials start when they come after the wait (before the next wgmma).
            for a, t in code[i + 1:]:
                if HGMMA.match(t) or "WARPGROUP.ARRIVE" in t:
                    break
                if "MUFU.EX2" in t:
                    lines.append(f"  {a:#07x}  MUFU.EX2 ... (after the wait)")
                    break
            ok = mufu_before >= exps
            lines.append(f"  {'ok' if ok else 'VIOLATION'}: {mufu_before} of the softmax's {exps} exponentials "
                         f"per thread run under the P V")
            return ok, lines
    lines.append("  no wait for the P V found")
    return False, lines


def check(sass, name_filter):
    kernels = functions(sass, name_filter)
    if not kernels:
        print(f"no kernel matches {name_filter!r}")
        return False
    all_ok = True
    for name, code in sorted(kernels.items()):
        gs = groups(code)
        loops = [(a, b) for a, b in zip(gs, gs[1:]) if a["kind"] == "SS" and b["kind"] == "RS"]
        print(name)
        if not loops:
            print("  no loop issue (an SS wgmma group followed by an RS group) found")
            all_ok = False
        for qk, pv in loops:
            ok, lines = check_loop(code, qk, pv)
            print("\n".join(lines))
            all_ok &= ok
    return all_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary", nargs="?", help="library .so, object or cubin with the 06d kernels")
    ap.add_argument("--sass", help="a cuobjdump -sass dump instead of a binary (- for stdin)")
    ap.add_argument("--elf", default="06d_", help="ELF images to read: names containing this (default 06d_)")
    ap.add_argument("--function", default=r"step06d.*fa3_forward", help="kernels: mangled names matching this regex")
    args = ap.parse_args()
    if args.sass:
        sass = sys.stdin.read() if args.sass == "-" else pathlib.Path(args.sass).read_text()
    elif args.binary:
        cuobjdump = find_cuobjdump()
        if not cuobjdump:
            print("skipped: no cuobjdump ($CUOBJDUMP, PATH, /usr/local/cuda/bin, the nvidia-cuda-cuobjdump wheel)")
            return SKIP
        sass = sass_of_binary(cuobjdump, args.binary, args.elf)
        if sass is None:
            print(f"skipped: no ELF image named *{args.elf}* in {args.binary} (built without 06d?)")
            return SKIP
    else:
        ap.error("give a binary or --sass")
    ok = check(sass, args.function)
    print("the softmax runs under the P V in every 06d loop" if ok else "FAILED: see VIOLATION above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""CPU test of scripts/plot.py on the committed sample CSV (results/sample/ladder_sample.csv).

Checks: the four PNGs exist and are non-empty; fp8_vs_bf16.png is written from --fp8 CSV (a few
synthetic fp8 rows) and only then, decode_vs_nk.png from --decode CSV (synthetic decode rows); the README rewrite replaces only the text
between the markers, links the images relative to the README, and is idempotent; a
header-only CSV and a README without markers behave (plots with "no data", a clear exit).

Plain script, no pytest: exit 0 = pass, 1 = failure, 77 = skipped (reason printed).
"""

import pathlib
import subprocess
import sys
import tempfile

SKIP = 77
REPO = pathlib.Path(__file__).resolve().parents[2]
PLOT = REPO / "scripts" / "plot.py"
SAMPLE = REPO / "results" / "sample" / "ladder_sample.csv"
PNGS = ["tflops_vs_n.png", "ladder_n4096_d128.png", "hbm_bytes_vs_n.png", "roofline.png"]
FP8_PNG = "fp8_vs_bf16.png"
DECODE_PNG = "decode_vs_nk.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
README = f"# Title\n\nintro text\n\n{BEGIN}\nstale table\n{END}\n\nclosing text\n"

try:
    import matplotlib  # noqa: F401
except ImportError as e:
    print(f"SKIP: matplotlib is not installed ({e})")
    sys.exit(SKIP)

failures = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def plot(*args):
    return subprocess.run([sys.executable, str(PLOT), *map(str, args)], capture_output=True, text=True)


def check_pngs(out_dir, label):
    for name in PNGS:
        path = out_dir / name
        check(path.is_file() and path.stat().st_size > 0, f"{label}: {name} written and non-empty")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)

        print("sample CSV:")
        readme = tmp / "README.md"
        readme.write_text(README)
        out = tmp / "results" / "sample"
        run = plot(SAMPLE, "--out", out, "--readme", readme)
        check(run.returncode == 0, f"plot.py exits 0 (stderr: {run.stderr.strip()[-500:]})")
        check_pngs(out, "sample")
        text = readme.read_text()
        check(text.startswith("# Title\n\nintro text\n\n" + BEGIN), "text before the block kept")
        check(text.endswith(END + "\n\nclosing text\n"), "text after the block kept")
        check("stale table" not in text, "old block replaced")
        check("| rung |" in text and "| 05_fa2_reordered |" in text, "TFLOPS table written")
        check("SAMPLE DATA" in text, "sample data labelled as such")
        for name in PNGS:
            check(f"(results/sample/{name})" in text, f"README links {name} relative to itself")
        run = plot(SAMPLE, "--out", out, "--readme", readme)
        check(run.returncode == 0 and readme.read_text() == text, "rewrite is idempotent")

        check(not (out / FP8_PNG).exists(), f"without --fp8: no {FP8_PNG}")

        print("--fp8 CSV:")
        header, *sample_rows = SAMPLE.read_text().splitlines()
        fa2 = [line for line in sample_rows if ",05_fa2_reordered,bf16," in line]
        check(len(fa2) > 0, "the sample has rows to make fp8 and 06d_fa3 rows of")
        bf16_06d = [line.replace(",05_fa2_reordered,", ",06d_fa3,") for line in fa2]
        fp8_rows = [line.replace(",05_fa2_reordered,bf16,", ",06_fp8,fp8,") for line in fa2]
        mixed = tmp / "fp8.csv"
        mixed.write_text("\n".join([header, *bf16_06d, *fp8_rows]) + "\n")
        run = plot(SAMPLE, "--out", tmp / "fp8", "--fp8", mixed)
        check(run.returncode == 0, f"fp8 rows: plot.py exits 0 (stderr: {run.stderr.strip()[-500:]})")
        path = tmp / "fp8" / FP8_PNG
        check(path.is_file() and path.stat().st_size > 0, f"fp8 rows: {FP8_PNG} written and non-empty")

        print("--decode CSV:")
        check(not (out / DECODE_PNG).exists(), f"without --decode: no {DECODE_PNG}")
        dec_rows = []  # decode-shaped rows made of a sample row: B in {1, 8}, Nq in {1, 4}, Nk 4k and 16k
        cols = header.split(",")
        base = dict(zip(cols, fa2[0].split(",")))
        for rung in ("05_fa2_decode", "torch_cudnn"):
            for b in (1, 8):
                for nq in (1, 4):
                    for nk in (4096, 16384):
                        r = dict(base, rung=rung, B=b, H=32, Hkv=8, Nq=nq, Nk=nk, d=128, causal=0,
                                 time_ms_median=1e-6 * nk * b * (2 if rung == "torch_cudnn" else 1))
                        dec_rows.append(",".join(str(r[c]) for c in cols))
        dec = tmp / "decode.csv"
        dec.write_text("\n".join([header, *dec_rows]) + "\n")
        run = plot(SAMPLE, "--out", tmp / "dec", "--decode", dec)
        check(run.returncode == 0, f"decode rows: plot.py exits 0 (stderr: {run.stderr.strip()[-500:]})")
        path = tmp / "dec" / DECODE_PNG
        check(path.is_file() and path.stat().st_size > 0, f"decode rows: {DECODE_PNG} written and non-empty")

        print("training steps (scripts/train_step_bench.py's columns):")
        steps = tmp / "train_step.csv"
        steps.write_text("gpu,shape,layers,d_model,heads,B,T,impl,peer,step_ms_median,peer_ms_median,speedup,git_sha\n"
                         "Some GPU,s1,2,256,4,16,256,ladder_05_fa2_reordered,sdpa_cudnn,5.0,4.0,0.800,abc1234\n"
                         "Some GPU,s1,2,256,4,16,256,ladder_05_fa2_reordered,sdpa_flash,5.0,6.0,1.200,abc1234\n"
                         "Some GPU,s2,2,256,4,16,512,ladder_05_fa2_reordered,sdpa_cudnn,9.0,9.0,1.000,abc1234\n")
        run = plot("--out", tmp / "steps", "--train-step", steps)
        check(run.returncode == 0, f"train steps: plot.py exits 0 (stderr: {run.stderr.strip()[-500:]})")
        path = tmp / "steps" / "train_step.png"
        check(path.is_file() and path.stat().st_size > 0, "train steps: train_step.png written and non-empty")
        check(not (tmp / "steps" / "tflops_vs_n.png").exists(), "--train-step alone draws nothing else")

        print("header-only CSV:")
        empty = tmp / "empty.csv"
        empty.write_text(SAMPLE.read_text().splitlines()[0] + "\n")
        readme.write_text(README)
        run = plot(empty, "--out", tmp / "empty", "--readme", readme)
        check(run.returncode == 0, f"no rows: plot.py exits 0 (stderr: {run.stderr.strip()[-500:]})")
        check_pngs(tmp / "empty", "no rows")

        print("README without markers:")
        bare = tmp / "bare.md"
        bare.write_text("# no markers here\n")
        run = plot(SAMPLE, "--out", tmp / "bare", "--readme", bare)
        check(run.returncode != 0 and "results:begin" in run.stderr, "refused with a message naming the markers")
        check(bare.read_text() == "# no markers here\n", "file left untouched")

    if failures:
        print(f"\n{len(failures)} failure(s)")
        return 1
    print("\nall passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The board's GEMM rates in bf16 and in e4m3, one run: what the 1.5x of the FP8 rung over
06d can be measured against. cuBLAS through PyTorch: torch.matmul in bf16 (fp32 accumulate)
and torch._scaled_mm in e4m3 (bf16 out, with and without use_fast_accum), M = N = K = 8192,
each after 1 s of the same launches back to back (the clock settles under the power cap), then
50 launches timed with CUDA events. Usage: gemm_ceiling.py [--seconds S]"""
import argparse
import time

import torch


def rate(fn, flops, seconds):
    end = time.time() + seconds
    while time.time() < end:
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        fn()
    stop.record()
    stop.synchronize()
    return flops * 50 / (start.elapsed_time(stop) * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    n = 8192
    flops = 2.0 * n * n * n
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    b8t = b8.t().contiguous().t()  # column-major, as _scaled_mm takes its second operand
    one = torch.ones((), device="cuda", dtype=torch.float32)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for name, fn in [
        ("bf16 matmul (fp32 accumulate)", lambda: a @ b),
        ("e4m3 _scaled_mm", lambda: torch._scaled_mm(a8, b8t, one, one, out_dtype=torch.bfloat16)),
        ("e4m3 _scaled_mm use_fast_accum", lambda: torch._scaled_mm(a8, b8t, one, one, out_dtype=torch.bfloat16,
                                                                     use_fast_accum=True)),
        ("bf16 matmul (fp32 accumulate), again", lambda: a @ b),
    ]:
        print(f"{name:40s} {rate(fn, flops, args.seconds):8.1f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()

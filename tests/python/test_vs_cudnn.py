"""pytest: scripts/vs_cudnn.py, a rung against SDPA's cuDNN backend timed call by call in turns.

summarize's arithmetic (ratio of the medians, a single round's extremes, mismatched rounds
refused), time_interleaved's turns (with a fake timer: the calls alternate, each after a
flush, each keeping its own times; train_step_bench's steps on them, on the CPU), then short runs on the GPU: a row per problem whose speedup is its two medians'
ratio and whose O agrees with cuDNN's, and a clear exit on a head dim the rung refuses. Skips
(with the reason) without torch, a Hopper GPU, cuDNN's SDPA backend or the built library.
"""

import csv
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import vs_cudnn  # noqa: E402


def test_summarize_ratio_of_medians_and_round_extremes():
    r, p, s, lo, hi = vs_cudnn.summarize([1.0, 2.0, 1.5], [1.2, 2.0, 1.2])
    assert (r, p) == (1.5, 1.2)
    assert s == pytest.approx(0.8)
    assert (lo, hi) == (pytest.approx(0.8), pytest.approx(1.2))
    with pytest.raises(ValueError):
        vs_cudnn.summarize([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        vs_cudnn.summarize([], [])


def test_time_interleaved_alternates_the_calls_and_keeps_their_times_apart(monkeypatch):
    monkeypatch.setattr(vs_cudnn.peers, "WARM_SECONDS", 0.0)  # warm-up: WARMUP turns only
    log, flushed = [], []
    calls = [lambda: log.append("a") or "a", lambda: log.append("b") or "b"]
    fake_ms = {"a": iter([3.0, 1.0, 2.0]), "b": iter([10.0, 30.0, 20.0])}
    got = vs_cudnn.time_interleaved(calls, 3, lambda: flushed.append(len(log)),
                                    timer=lambda call: next(fake_ms[call()]), sync=lambda: None)
    warm = vs_cudnn.peers.WARMUP
    assert log == ["a", "b"] * (warm + 3)  # warm-up turns, then timed turns, a before b in each
    assert got == [2.0, 20.0]  # each call's own median
    assert flushed == [2 * warm + k for k in range(6)]  # one flush before every timed call


def test_train_steps_take_turns_each_with_its_own_attention(monkeypatch):
    """scripts/train_step_bench.py times its steps with time_interleaved: every callable of
    step_calls runs one forward + backward step through its own attention, in turns."""
    import train_step_bench
    monkeypatch.setattr(vs_cudnn.peers, "WARM_SECONDS", 0.0)
    seen = []

    def attention(tag):
        def attend(q, k, v):
            seen.append(tag)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attend

    model = train_step_bench.Model(2, 16, 2, None)  # two layers: two attentions a step
    x = torch.randn(1, 8, 16)
    calls = train_step_bench.step_calls(model, x, [("a", attention("a")), ("b", attention("b"))])
    got = vs_cudnn.time_interleaved(calls, 2, lambda: None, timer=lambda call: call() or 1.0, sync=lambda: None)
    assert got == [1.0, 1.0]
    assert seen == ["a", "a", "b", "b"] * (vs_cudnn.peers.WARMUP + 2)
    assert all(p.grad is not None for p in model.parameters())


def skip_without_hopper_and_cudnn():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("06d_fa3 needs a Hopper GPU visible to torch")
    if not vs_cudnn.attn_ladder.library_path().is_file():
        pytest.skip(f"libattn_ladder.so not built ({vs_cudnn.attn_ladder.library_path()})")
    if not torch.backends.cudnn.is_available():
        pytest.skip("cuDNN is not available to torch")


def test_short_run_writes_consistent_rows(tmp_path):
    skip_without_hopper_and_cudnn()
    out = tmp_path / "vs.csv"
    assert vs_cudnn.main(["--d", "64", "--n", "512", "--causal", "both", "--rounds", "2", "--repeats", "3",
                          "--csv", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert [(r["N"], r["d"], r["causal"]) for r in rows] == [("512", "64", "0"), ("512", "64", "1")]
    for r in rows:
        assert r["B"] == "32" and r["H"] == "32" and r["rounds"] == "2"
        assert float(r["speedup"]) == pytest.approx(float(r["peer_ms"]) / float(r["rung_ms"]), rel=2e-3)
        assert float(r["speedup_min"]) <= float(r["speedup_max"])
        assert float(r["o_diff"]) <= vs_cudnn.O_DIFF_BOUND
    with pytest.raises(SystemExit, match="refuses d=96"):  # a head dim 06d does not build: a clear exit
        vs_cudnn.main(["--d", "96", "--n", "512", "--causal", "0", "--rounds", "1"])


def test_backward_in_turns_appends_rows(tmp_path):
    """--backward with two rungs: a row per rung against cuDNN's backward, gradients within the
    bound of cuDNN's; --append adds them under the forward's header, written once."""
    skip_without_hopper_and_cudnn()
    out = tmp_path / "vs.csv"
    short = ["--d", "64", "--n", "512", "--causal", "0", "--rounds", "2", "--repeats", "3", "--csv", str(out)]
    assert vs_cudnn.main(short) == 0
    assert vs_cudnn.main(short + ["--backward", "--rung", "06d_fa3,05_fa2_reordered", "--append"]) == 0
    assert sum(1 for line in open(out) if line.startswith("gpu,")) == 1
    rows = list(csv.DictReader(open(out)))
    assert [(r["rung"], r["peer"]) for r in rows] == [("06d_fa3", "torch_cudnn"), ("06d_fa3_bwd", "torch_cudnn_bwd"),
                                                      ("05_fa2_reordered_bwd", "torch_cudnn_bwd")]
    for r in rows[1:]:
        assert float(r["speedup"]) == pytest.approx(float(r["peer_ms"]) / float(r["rung_ms"]), rel=2e-3)
        assert float(r["o_diff"]) <= vs_cudnn.O_DIFF_BOUND

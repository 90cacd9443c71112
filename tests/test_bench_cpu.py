"""Smoke test of bench/cpu.py on a tiny shape, so the benchmark cannot rot (no timing asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="bench/cpu.py times the Numba kernels (pip install numba)")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "cpu.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_cpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # compiles every variant (the bench validates each); CI runs it (pytest -m slow)
def test_quick_run_writes_a_table(tmp_path):
    bench = _load_bench()
    out = tmp_path / "cpu.md"
    rc = bench.main(["--quick", "--cases", "float32:64x96", "--out", str(out),
                     "--plot", str(tmp_path / "cpu.png")])
    assert rc == 0
    text = out.read_text()
    from bench.variants.numba_cpu_history import VARIANTS  # bench/cpu.py put the root on the path

    vf, vb = max(VARIANTS["rms_norm_forward"]), max(VARIANTS["rms_norm_backward"])
    assert f"numba rms_norm fwd v{vf} (default)" in text
    assert f"numba rms_norm bwd v{vb} (default)" in text
    assert bench.OUT_FWD in text and bench.OUT_BWD in text
    assert "float32:64x96 fwd: out= " in text and "float32:64x96 bwd: out= " in text
    assert "parallel copy (prange)" in text
    for name in (bench.LN_FWD, bench.LN_BWD, bench.LN_OUT_FWD, bench.LN_OUT_BWD,
                 bench.ADD_FWD, bench.ADD_BWD):
        assert f"| float32:64x96 | {name} | " in text, name
    assert "RMSNorm/LayerNorm time ratio (fwd)" in text
    assert ("- float32:64x96 RMSNorm/LayerNorm time ratio, default kernels of each, out=: fwd "
            in text)
    assert "REFUSED" not in text, text


def test_a_wrong_candidate_is_refused_not_timed():
    bench = _load_bench()
    calls = []
    good = bench.Candidate("copy", "copy", lambda: calls.append("good"), 8)
    bad = bench.Candidate("wrong", "fwd", lambda: calls.append("bad"), 8,
                          check=lambda: "3 elements beyond 1 ulp")
    bench.measure([good, bad], rounds=2, repeats=1)
    assert bad.refused == "3 elements beyond 1 ulp" and bad.times == []
    assert "bad" not in calls and len(good.times) == 2
    rows = bench.summarise("t", [good, bad, *_fake_defaults(bench)])
    assert "REFUSED: 3 elements beyond 1 ulp" in bench.markdown(rows, "#")


def _fake_defaults(bench):
    f = bench.Candidate("numba rms_norm fwd v2 (default)", "fwd", lambda: None, 8)
    b = bench.Candidate("numba rms_norm bwd v2 (default)", "bwd", lambda: None, 8)
    f.times, b.times = [1.0, 1.0], [1.0, 1.0]
    return [f, b]


def test_layer_norm_ratio_uses_the_default_kernels_called_with_out():
    """The RMSNorm/LayerNorm ratio divides the default RMSNorm kernels' ``out=`` times by
    LayerNorm's ``out=`` times; the allocating calls, whose time varies with the OS, and older
    variants do not enter it."""
    bench = _load_bench()
    copy, copy_new = (bench.Candidate(n, "copy", lambda: None, 8) for n in ("c", "c new"))
    old = bench.Candidate("numba rms_norm fwd v2", "fwd", lambda: None, 8)
    out_f = bench.Candidate(bench.OUT_FWD, "fwd", lambda: None, 8)
    out_b = bench.Candidate(bench.OUT_BWD, "bwd", lambda: None, 8)
    ln_f = bench.Candidate(bench.LN_FWD, "fwd", lambda: None, 8)  # allocating: ignored
    ln_b = bench.Candidate(bench.LN_BWD, "bwd", lambda: None, 8)
    ln_out_f = bench.Candidate(bench.LN_OUT_FWD, "fwd", lambda: None, 8)
    ln_out_b = bench.Candidate(bench.LN_OUT_BWD, "bwd", lambda: None, 8)
    for c, t in ((copy, 1.0), (copy_new, 1.0), (old, 9.0), (out_f, 1.0), (out_b, 2.0),
                 (ln_f, 40.0), (ln_b, 80.0), (ln_out_f, 4.0), (ln_out_b, 16.0)):
        c.times = [t, t]
    rows = bench.summarise("t", [copy, copy_new, old, *_fake_defaults(bench), out_f, out_b,
                                 ln_f, ln_b, ln_out_f, ln_out_b])
    ratios = {r["name"]: r["value"] for r in rows if r["kind"] == "ratio"}
    assert ratios == {"RMSNorm/LayerNorm time ratio (fwd)": 0.25,
                      "RMSNorm/LayerNorm time ratio (bwd)": 0.125}
    assert ("- t RMSNorm/LayerNorm time ratio, default kernels of each, out=: fwd 0.25, "
            "bwd 0.12") in bench.targets(rows)


def test_overlap_model_under_each_target():
    """The in-cache arithmetic a against the copy's time per element on a thread c gives the
    two bounds max(1, a/c) (full overlap) and 1 + a/c (none), and which one the target needs."""
    bench = _load_bench()
    copy = bench.Candidate("c", "copy", lambda: None, 4000, baseline="out")
    copy.times = [1e-6, 2e-6]  # B = 4e9 and 2e9 bytes/s: median 3e9
    fwd, bwd = _fake_defaults(bench)
    fwd.nbytes, bwd.nbytes = 3000, 6000  # 1 and 2 ns per element at B, for 1000 elements
    rows = bench.arithmetic_rows("t", [copy, fwd, bwd], {"fwd kernel": 0.5, "bwd kernel": 6.0},
                                 1000, 2)
    by = {r["label"]: r for r in rows}
    assert by["fwd"]["copy_ns"] == pytest.approx(2.0) and by["bwd"]["copy_ns"] == pytest.approx(4.0)
    # fwd: a/c = 0.25: full overlap 1.00x, none 1.25x
    assert "0.25x the copy's 2.000 ns" in bench._overlap_model(by["fwd"], 1.25)
    assert "full overlap would give 1.00x the copy, none 1.25x" in bench._overlap_model(
        by["fwd"], 1.25)
    assert bench._overlap_model(by["fwd"], 1.25).endswith("within reach even with no overlap")
    assert bench._overlap_model(by["fwd"], 1.2).endswith(
        "within reach only where the arithmetic overlaps the memory")
    # bwd: a/c = 1.5: even full overlap gives 1.5x
    assert bench._overlap_model(by["bwd"], 1.4).endswith(
        "out of reach with this arithmetic per element")
    new = bench.Candidate("c new", "copy", lambda: None, 4000, baseline="new")
    out_f = bench.Candidate(bench.OUT_FWD, "fwd", lambda: None, 3000)
    out_b = bench.Candidate(bench.OUT_BWD, "bwd", lambda: None, 6000)
    new.times, out_f.times, out_b.times = [2e-6, 2e-6], [1e-6, 1e-6], [2e-6, 2e-6]
    lines = bench.targets([*bench.summarise("t", [copy, new, fwd, bwd, out_f, out_b]), *rows])
    at = [i for i, line in enumerate(lines) if line.startswith("- t fwd: out= ")][0]
    assert lines[at + 1].startswith("  arithmetic in cache 0.500 ns per element")
    assert lines[at + 3].startswith("  arithmetic in cache 6.000 ns per element")


def test_the_copy_bandwidth_is_the_faster_copy_of_each_round():
    """Two preallocated copies, each the faster in one round: every ratio is taken against the
    faster copy of its own round (a slow copy would make a kernel look close to the copy), and
    the allocating ratio against the allocating copy."""
    bench = _load_bench()
    a, b = (bench.Candidate(n, "copy", lambda: None, 8, baseline="out") for n in ("a", "b"))
    new = bench.Candidate("new", "copy", lambda: None, 8, baseline="new")
    a.times, b.times, new.times = [1.0, 4.0], [2.0, 2.0], [4.0, 4.0]
    fwd, bwd = _fake_defaults(bench)
    fwd.times = [2.0, 4.0]
    rows = bench.summarise("t", [a, b, new, fwd, bwd])
    row = next(r for r in rows if r["name"] == fwd.name)
    # round 1: B = 8 bytes/s (a), 2 s against 1 s; round 2: B = 4 (b), 4 s against 2 s
    assert row["x_copy"] == 2.0
    assert row["x_copy_new"] == 0.75  # against 4 s each round: 0.5 and 1.0


def test_peer_ratios_in_the_targets_section():
    """torch/rmsref and XLA/rmsref time ratios are printed per case under the targets."""
    bench = _load_bench()
    rows = [{"case": "c", "name": "jax 0.10 jit fwd", "kind": "fwd", "speedup_ours": 2.5},
            {"case": "c", "name": "torch 2 fwd+autograd bwd", "kind": "fwd+bwd",
             "speedup_ours": 12.25}]
    text = "\n".join(bench.targets(rows))
    assert "- c torch/rmsref time fwd+bwd 12.25; XLA/rmsref time fwd 2.50" in text


@pytest.mark.slow  # compiles every variant, as the quick run above
def test_a_quick_run_leaves_the_committed_results_alone(tmp_path, monkeypatch):
    """--quick without --out/--plot writes quick-cpu.md (and its plot) to the temporary folder:
    a smoke run must not replace bench/results/cpu.md or cpu_gbps.png."""
    import tempfile

    bench = _load_bench()
    results = Path(bench.RESULTS)
    before = {p.name: p.stat().st_mtime_ns for p in results.glob("cpu*")}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert bench.main(["--quick", "--cases", "float32:64x96", "--no-torch", "--no-jax",
                       "--no-oracle"]) == 0
    assert (tmp_path / "quick-cpu.md").read_text().startswith("# bench/cpu.py")
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("cpu*")} == before


@pytest.mark.slow  # compiles the default float32 kernels' loops
def test_in_cache_times_the_default_kernels():
    from bench.halfrow import in_cache

    got = in_cache(np.dtype(np.float32), 128, reps=4, rounds=1)
    assert set(got) == {"fwd kernel", "bwd kernel"}
    assert all(0.0 < v < 1e4 for v in got.values()), got


@pytest.mark.slow  # compiles the four default float32 kernels
def test_slow_state_reproducer_runs(capsys):
    """bench/slow_state.py times the kernels round by round and checks their bits each round."""
    from bench.slow_state import main

    assert main(["--seconds", "0.2", "--no-sleep", "--n", "128", "--rows", "16",
                 "--calls", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("LayerNorm bwd", "RMSNorm bwd", "LayerNorm fwd", "RMSNorm fwd"):
        assert f"{name} " in out, name
    assert "rounds with a kernel over 2x its first reading: " in out


@pytest.mark.slow  # compiles the backward's row helper and its rebuilt variant
def test_halfbwd_rebuilt_row_is_the_kernels_row():
    """bench/halfbwd.py times variants of the backward's row that differ from the kernel's only
    where they say: its "as rebuilt" row must give the kernel's bits (dx, the dweight partial
    row, the next row's Σ dxhat·x). A change to ``_bwd_row_and_dot`` that the bench does not
    follow fails here."""
    from numba import njit

    import rmsref
    from bench.halfbwd import _rows
    from rmsref.kernels import numba_cpu as K

    rebuilt = _rows()["as rebuilt"]

    @njit
    def both(g3, x3, w, dx_a, dx_b, parts_a, parts_b):
        a = K._bwd_row_and_dot(g3, x3, 0, 0, w, 0.7, 0.03, dx_a, parts_a, 0, 0, 1)
        b = rebuilt(g3, x3, 0, 0, w, w.astype(np.float32), 0.7, 0.03, dx_b, parts_b,
                    np.zeros(1, np.float32), 0, 0, 1, np.float32(0.0))
        return a[0], b[0], a[1], b[1]

    rng = np.random.default_rng(5)
    for dtype in (rmsref.bfloat16, np.dtype(np.float16), np.dtype(np.float32)):
        x3 = K._bits(rng.standard_normal((1, 2, 192)).astype(dtype))
        g3 = K._bits(rng.standard_normal((1, 2, 192)).astype(dtype))
        w = 1.0 + 0.1 * rng.standard_normal(192)
        dx_a, dx_b = np.zeros_like(x3), np.zeros_like(x3)  # row 1 is only read
        parts_a, parts_b = np.zeros((1, 192)), np.zeros((1, 192))
        s_a, s_b, out_a, out_b = both(g3, x3, w, dx_a, dx_b, parts_a, parts_b)
        assert s_a == s_b and out_a == out_b, dtype
        np.testing.assert_array_equal(dx_a, dx_b, err_msg=str(dtype))
        np.testing.assert_array_equal(parts_a, parts_b, err_msg=str(dtype))


@pytest.mark.slow  # compiles the float32 dx row and its rebuilt variant
def test_halfbwd_compensated_row_is_the_kernels_float32_row():
    """The float16 backward's float32 dx row (``_bwd_row_and_dot_f32``) is bench/halfbwd.py's
    "+ dweight loop" variant, bit for bit (dx, the dweight partial row, the next row's sum),
    so the bench's figures for that variant are the shipped row's."""
    from numba import njit

    from bench.halfbwd import _rows
    from rmsref.kernels import numba_cpu as K

    rebuilt = _rows()["+ dweight loop"]

    @njit
    def both(g3, x3, w, w32, dx_a, dx_b, parts_a, parts_b):
        a = K._bwd_row_and_dot_f32(g3, x3, 0, 0, w, w32, 0.7, 0.03, dx_a, parts_a, 0, 0,
                                   1, None, None)
        b = rebuilt(g3, x3, 0, 0, w, w32, 0.7, 0.03, dx_b, parts_b, np.zeros(1, np.float32),
                    0, 0, 1, np.float32(0.0))
        return a[0], b[0], a[1], b[1]

    rng = np.random.default_rng(6)
    x3 = K._bits(rng.standard_normal((1, 2, 192)).astype(np.float16))
    g3 = K._bits(rng.standard_normal((1, 2, 192)).astype(np.float16))
    w = (1.0 + 0.1 * rng.standard_normal(192)).astype(np.float16).astype(np.float64)
    w32 = K._f32_weight(g3, x3, x3, w)
    assert w32 is not None
    dx_a, dx_b = np.zeros_like(x3), np.zeros_like(x3)
    parts_a, parts_b = np.zeros((1, 192)), np.zeros((1, 192))
    s_a, s_b, out_a, out_b = both(g3, x3, w, w32, dx_a, dx_b, parts_a, parts_b)
    assert s_a == s_b and out_a == out_b
    np.testing.assert_array_equal(dx_a, dx_b)
    np.testing.assert_array_equal(parts_a, parts_b)


@pytest.mark.slow  # compiles three row variants and the default backward
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_halfbwd_accuracy_table_supports_the_summary(dtype):
    """What bench/results/cpu-summary.md reads from bench/halfbwd.py's accuracy table, at a
    small size: the float64 route and the compensated float32 dx keep the half contract
    (>= 99.9 % of dx bit-equal to the oracle's, none more than one ulp away) on every kind of
    data, while a plain float32 dx loses it where dy lies along y (cancellation)."""
    import rmsref
    from bench.halfbwd import DATA, accuracy

    got = accuracy(rmsref.bfloat16 if dtype == "bfloat16" else np.dtype(dtype), 256, 16)
    for kind in DATA:
        for route in ("shipped kernel", "float64 dx (as rebuilt)", "compensated float32 dx"):
            equal, beyond_one_ulp, _, _ = got[kind, route]
            assert equal >= 99.9 and beyond_one_ulp == 0.0, (kind, route, got[kind, route])
    equal, beyond_one_ulp, _, flagged = got["dy = y, w = 1", "float32 dx"]
    assert equal < 99.9 and beyond_one_ulp > 0.0, got["dy = y, w = 1", "float32 dx"]
    assert flagged == 100.0  # the cancellation test would send every row back to float64


@pytest.mark.slow  # compiles every row variant for three dtypes
def test_halfbwd_runs_for_every_dtype(capsys):
    """bench/halfbwd.py at a tiny size, every dtype it offers: each variant compiles for each
    (a float32 row once met a float32-only helper with float64 operands) and the tables
    come out, with no timing for the half-only row on float32."""
    from bench.halfbwd import main

    assert main(["--n", "128", "--reps", "2", "--rounds", "1", "--rows", "4"]) == 0
    out = capsys.readouterr().out
    assert "| row | bfloat16 | float16 | float32 |" in out
    shipped32 = next(line for line in out.splitlines() if line.startswith("| shipped float32"))
    assert shipped32.endswith("| - |"), shipped32
    assert "| float16 | dy = y, w = 1 | compensated float32 dx |" in out


def test_halfrow_imports_another_commits_kernels_beside_these(tmp_path):
    """``bench/halfrow.py --against REV``: REV's rmsref, exported by git, is imported as a
    package of its own (``rmsref_rev``), its modules apart from this tree's, with none of its
    imports left pointing at this tree's rmsref."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: --against needs git")
    sys.path.insert(0, str(root))
    try:
        from bench.halfrow import HERE, tree_at
    finally:
        sys.path.remove(str(root))
    try:
        suffix, kernels, halfbits = tree_at("HEAD", tmp_path)
    finally:
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))
    assert suffix == " HEAD"
    assert kernels.__name__ == "rmsref_rev.kernels.numba_cpu"
    assert halfbits.__name__ == "rmsref_rev.kernels._halfbits"
    assert kernels is not HERE[1] and kernels._bits is not HERE[1]._bits
    assert Path(kernels.__file__).parent != Path(HERE[1].__file__).parent
    source = Path(kernels.__file__).read_text()
    assert "from rmsref." not in source and "from rmsref_rev." in source

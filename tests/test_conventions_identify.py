"""identify ranks conventions by bit-exact agreement with an implementation's output, with the
rstd read back by estimate_rstd; describe prints every convention's record. The implementations
here are NumPy functions (emulations, and emulations with a statistic of their own), so every
rate is known in advance."""

from __future__ import annotations

import numpy as np
import pytest

from rmsref import conventions as C
from rmsref._declared import Declared
from rmsref._shapes import bfloat16

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SHAPE = (16, 96)                                     # small: identify emulates every convention
POOL = [n for n in C.names() if n != "paper"]


def as_convention(name, offset=None):
    def forward(x, n, w, eps):
        return C.emulate(name, x, w, eps, offset=offset)
    return forward


def rstd32(x, eps) -> np.ndarray:
    """R(1/sqrt(R(R(mean(x²)) + eps))) in float32, per row (M, 1)."""
    x64 = np.asarray(x).astype(np.float64)
    s = np.mean(x64 * x64, axis=1, keepdims=True).astype(np.float32) + np.float32(eps)
    return (1.0 / np.sqrt(s.astype(np.float64))).astype(np.float32)


def raised(r) -> np.ndarray:
    """rstd 2^-12 higher (32 float32 ulps): enough to change some half-precision outputs."""
    return (r * (1 + 2.0**-12)).astype(np.float32)


def nudged(name, rows=(0, 3, 5)):
    """Convention ``name`` with a statistic of its own: ours, raised in the given rows."""
    def forward(x, n, w, eps):
        r = rstd32(x, eps)
        r[list(rows)] = raised(r[list(rows)])
        return C.emulate(name, x, w, eps, rstd=r)
    return forward


@pytest.mark.parametrize("name", ["llama", "t5", "native", "flax"])
def test_identify_ranks_each_convention_first(name):
    """A NumPy implementation of a convention matches it on every element (rate 1.0, in every
    case) and every other convention on fewer."""
    ranking = C.identify(as_convention(name), shape=SHAPE)
    assert [m.name for m in ranking][0] == name
    top = ranking[0]
    assert top.rate == 1.0 and top.dtype_match
    assert top.rates == {"bfloat16/w=bfloat16": 1.0, "bfloat16/w=float32": 1.0,
                         "float16/w=float16": 1.0, "float16/w=float32": 1.0}
    assert all(m.rate < 1.0 for m in ranking[1:]), [(m.name, m.rate) for m in ranking]
    assert sorted(m.name for m in ranking) == sorted(POOL)
    rates = [m.rate for m in ranking]
    assert rates == sorted(rates, reverse=True)


def test_identify_ranks_torch_first_among_its_equals():
    """torch, fused_fp32 (the same rule) and fused_fp32_div (an rstd within an ulp: the same
    half-precision outputs here) tie at 1.0; torch is listed first. The others match less."""
    ranking = C.identify(as_convention("torch"), shape=SHAPE)
    assert [m.name for m in ranking[:3]] == ["torch", "fused_fp32", "fused_fp32_div"]
    assert [m.rate for m in ranking[:3]] == [1.0, 1.0, 1.0]
    assert all(m.rate < 0.9 for m in ranking[3:])


def test_identify_reads_a_declared_or_given_offset():
    """Gemma's weight is used as 1 + w: identify reads rstd back with w = 0 (the neutral weight)
    when the forward declares offset 1, or when offset=1 is passed."""
    gemma = as_convention("gemma")
    gemma.rmsref_declared = Declared(offset=1.0)
    ranking = C.identify(gemma, shape=SHAPE)
    assert ranking[0].name == "gemma" and ranking[0].rate == 1.0
    ranking = {m.name: m.rate for m in C.identify(as_convention("gemma"), shape=SHAPE,
                                                  offset=1.0)}
    assert ranking["gemma"] == ranking["torch"] == 1.0     # torch with offset 1 is gemma
    assert ranking["gemma_wdtype"] < 0.9 and ranking["llama"] < 0.9
    torch_like = as_convention("torch", offset=0.5)
    ranking = C.identify(torch_like, shape=SHAPE, offset=0.5, candidates=["llama", "torch"])
    assert [m.name for m in ranking] == ["torch", "llama"] and ranking[0].rate == 1.0


def test_identify_shares_the_implementations_statistic():
    """An implementation whose rstd is one ulp off ours in some rows still matches its
    convention bit for bit when its rstd is read back (share_statistic); without sharing it
    misses elements of those rows only."""
    for name in ("torch", "llama"):
        shared = C.identify(nudged(name), shape=SHAPE, candidates=[name])
        assert shared[0].rate == 1.0
        own = C.identify(nudged(name), shape=SHAPE, candidates=[name], share_statistic=False)
        assert 0.5 < own[0].rate < 1.0 - 0.5 / SHAPE[0]
        assert own[0].rate >= 1.0 - 3 / SHAPE[0]       # only the three nudged rows can differ


def test_identify_passes_its_inputs_and_records_cases():
    """forward(x, n, w, eps): x of each requested dtype and the given shape, Gaussian around 0
    with standard deviation 2; w of the requested weight dtypes, around 1 with standard deviation
    0.3; the given eps; the feature count n. The same seed gives the same inputs."""
    seen = []

    def forward(x, n, w, eps):
        seen.append((x.copy(), n, None if w is None else w.copy(), eps))
        return C.emulate("llama", x, w, eps)

    ranking = C.identify(forward, dtypes=("float16",), shape=(32, 200), eps=1e-3,
                         weight_dtypes=(None, "bfloat16", "float32"), share_statistic=False)
    assert [(x.dtype, x.shape, n, e) for x, n, _, e in seen] == [(F16, (32, 200), 200, 1e-3)] * 3
    assert [w.dtype for _, _, w, _ in seen] == [F16, bfloat16, F32]
    x, w = seen[0][0].astype(np.float64), seen[2][2].astype(np.float64)
    assert abs(x.mean()) < 0.1 and 1.9 < x.std() < 2.1
    assert abs(w.mean() - 1.0) < 0.06 and 0.25 < w.std() < 0.35
    assert set(ranking[0].rates) == {"float16/w=float16", "float16/w=bfloat16",
                                     "float16/w=float32"}
    again = []
    C.identify(lambda x, n, w, eps: again.append(x) or C.emulate("llama", x, w, eps),
               dtypes=("float16",), shape=(32, 200), weight_dtypes=(None,), share_statistic=False)
    np.testing.assert_array_equal(again[0], seen[0][0])
    other = C.identify(forward, dtypes=("float16",), shape=(32, 200), seed=1,
                       weight_dtypes=(None,), share_statistic=False)
    assert other and not np.array_equal(seen[-1][0], seen[0][0])


def test_identify_inputs_are_reproducible_from_the_seed():
    """x = 2·N(0, 1) and then w = 1 + 0.3·N(0, 1) per weight dtype, drawn from
    default_rng(seed) as float32 values (as float32 data cast down: float64 rounded straight to
    float16 differs in a few elements of this size) and rounded to each dtype; eps defaults to
    1e-5."""
    seen = []

    def forward(x, n, w, eps):
        seen.append((x, w, eps))
        return C.emulate("torch", x, w, eps)

    m, n = 4, 65536
    C.identify(forward, dtypes=("float16",), shape=(m, n), weight_dtypes=("float16", "bfloat16"),
               share_statistic=False, seed=7, candidates=["torch"])
    g = np.random.default_rng(7)
    x32 = (g.standard_normal((m, n)) * 2.0).astype(np.float32)
    w32 = [(1.0 + 0.3 * g.standard_normal(n)).astype(np.float32) for _ in range(2)]
    np.testing.assert_array_equal(seen[0][0], x32.astype(F16))
    np.testing.assert_array_equal(seen[0][1], w32[0].astype(F16))
    np.testing.assert_array_equal(seen[1][1], w32[1].astype(bfloat16))
    assert [eps for _, _, eps in seen] == [1e-5, 1e-5]


def test_identify_without_a_weight():
    """A forward declared without a weight runs without one (cases 'w=none')."""
    calls = []

    def plain(x, n, w, eps):
        calls.append(w)
        return C.emulate("torch", x, None, eps)

    plain.rmsref_declared = Declared(has_weight=False)
    ranking = C.identify(plain, shape=SHAPE)
    assert all(w is None for w in calls)
    assert set(ranking[0].rates) == {"bfloat16/w=none", "float16/w=none"}
    assert ranking[0].rate == 1.0


def test_identify_skips_refused_dtypes_and_falls_back_to_float32():
    """A dtype or weight dtype the forward refuses is skipped; a forward that takes float32 only
    is ranked on float32 (one case: the input's dtype and 'float32' are the same weight); one
    that takes nothing is an error naming every refusal."""
    def no_float16(x, n, w, eps):
        if x.dtype == F16:
            raise TypeError("no float16 here")
        return C.emulate("torch", x, w, eps)

    ranking = C.identify(no_float16, shape=SHAPE)
    assert set(ranking[0].rates) == {"bfloat16/w=bfloat16", "bfloat16/w=float32"}

    def same_dtypes_only(x, n, w, eps):
        if w is not None and w.dtype != x.dtype:
            raise TypeError("weight dtype must be the input's")
        return C.emulate("torch", x, w, eps)

    ranking = C.identify(same_dtypes_only, shape=SHAPE)
    assert set(ranking[0].rates) == {"bfloat16/w=bfloat16", "float16/w=float16"}
    ranking = C.identify(same_dtypes_only, shape=SHAPE, dtypes=("float16",),
                         weight_dtypes=("float32", None, "bfloat16"))   # refused, taken, refused
    assert set(ranking[0].rates) == {"float16/w=float16"}
    ranking = C.identify(as_convention("torch"), shape=SHAPE, dtypes=("float32",),
                         weight_dtypes=(None, "float32", "bfloat16", "float16"))
    assert set(ranking[0].rates) == {"float32/w=float32", "float32/w=bfloat16",
                                     "float32/w=float16"}      # None and float32: one case

    def float32_only(x, n, w, eps):
        if x.dtype != F32:
            raise TypeError(f"float32 only, got {x.dtype}")
        return C.emulate("flax", x, w, eps)

    ranking = C.identify(float32_only, shape=SHAPE)
    assert ranking[0].name == "flax" and ranking[0].rate == 1.0
    assert set(ranking[0].rates) == {"float32/w=float32"}

    def nothing(x, n, w, eps):
        raise TypeError(f"refused {x.dtype}")

    with pytest.raises(ValueError) as info:                  # float32 asked: not tried twice
        C.identify(nothing, shape=SHAPE, dtypes=("float32",), weight_dtypes=("float32",))
    assert str(info.value) == ("identify: the implementation ran on none of the inputs: "
                               "float32 x with float32 weight: refused float32")

    with pytest.raises(ValueError) as info:
        C.identify(nothing, shape=SHAPE, dtypes=("float16",), weight_dtypes=("float32",))
    assert str(info.value) == ("identify: the implementation ran on none of the inputs: "
                               "float16 x with float32 weight: refused float16; "
                               "float32 x with float32 weight: refused float32")


def test_identify_float32_fallback_keeps_eps_offset_and_the_shared_statistic():
    """The float32 fallback runs as the requested dtypes would: the given eps and offset (the
    neutral weight 1 − offset for the statistic) and the implementation's own rstd."""
    eps_seen = []

    def gemma32(x, n, w, eps):                  # float32 only; w (required) used as 1 + w
        if x.dtype != F32 or w is None:
            raise TypeError("float32 x and a weight only")
        eps_seen.append(eps)
        return nudged("torch")(x, n, w + np.float32(1), eps)

    ranking = C.identify(gemma32, shape=SHAPE, eps=1e-4, offset=1.0, candidates=["torch"])
    assert ranking[0].rate == 1.0 and set(ranking[0].rates) == {"float32/w=float32"}
    assert set(eps_seen) == {1e-4}
    own = C.identify(gemma32, shape=SHAPE, eps=1e-4, offset=1.0, candidates=["torch"],
                     share_statistic=False)
    assert own[0].rate < 1.0 - 2 / SHAPE[0]             # three rows off in nearly every element


def test_identify_dtype_match_holds_in_every_case():
    """dtype_match is whether the output dtype was the convention's in every case, not the
    last one: torch's bfloat16 output is float32 for llama with a float32 weight."""
    ranking = {m.name: m for m in C.identify(as_convention("llama"), shape=SHAPE,
                                             weight_dtypes=("float32", None))}
    assert ranking["llama"].dtype_match and not ranking["torch"].dtype_match


def test_identify_ties_rank_by_dtype_then_listing():
    """Equal rates rank the conventions whose output dtype matches first, then in listing
    order; NaN in the output matches no finite value."""
    def nan_out(x, n, w, eps):
        return np.full(x.shape, np.nan, x.dtype)

    ranking = C.identify(nan_out, shape=SHAPE, share_statistic=False)
    assert all(m.rate == 0.0 for m in ranking)
    promoting = ["llama", "t5", "native", "flax"]        # float32 out with a float32 weight
    same = [n for n in POOL if n not in promoting]
    assert [m.name for m in ranking] == same + promoting
    assert [m.dtype_match for m in ranking] == [True] * len(same) + [False] * 4


def test_identify_counts_nan_matching_nan_and_only_that():
    """A NaN where the convention has a number is a miss; NaN where it has NaN is a match."""
    def one_nan(x, n, w, eps):
        y = C.emulate("torch", x, w, eps)
        y[0, 0] = np.nan
        return y

    ranking = C.identify(one_nan, shape=SHAPE, candidates=["torch"])
    assert ranking[0].rate == 1.0 - 1.0 / (SHAPE[0] * SHAPE[1])
    ranking = C.identify(as_convention("torch"), shape=SHAPE, eps=float("nan"),
                         candidates=["torch", "llama"])
    assert [m.rate for m in ranking] == [1.0, 1.0]


# ---- estimate_rstd ------------------------------------------------------------------------------


def test_estimate_rstd_reads_back_the_implementations_statistic(rng):
    """The float32 rstd of each row, exactly, from a float32 run, even with zeros in x and a few
    elements of each row off (the value that occurs most often wins)."""
    import warnings

    x = (2.0 * rng.standard_normal((8, 64))).astype(np.float32).astype(bfloat16)
    x[2, :5] = 0
    x[4] = 1                                             # a row of ones is a row like another
    seen = []

    def forward(x, n, w, eps):
        seen.append((x.dtype, n, w, eps))
        y = nudged("torch", rows=(1, 2, 6))(x, n, w, eps)
        y[:, -3:] *= np.float32(1.5)                     # three elements per row disagree
        y[2, :2] = 1.0                                   # and a bias where x is 0: y/0 is Inf
        return y

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = C.estimate_rstd(forward, x, 1e-5)
    assert seen == [(F32, 64, None, 1e-5)]
    assert r.dtype == F32 and r.shape == (8, 1)
    exact = rstd32(x, 1e-5)
    up = raised(exact)
    np.testing.assert_array_equal(r[[0, 3, 4, 5, 7]], exact[[0, 3, 4, 5, 7]])
    np.testing.assert_array_equal(r[[1, 2, 6]], up[[1, 2, 6]])


def test_estimate_rstd_with_an_offset_weight(rng):
    """With offset o the neutral weight is w = 1 − o (zeros for Gemma's 1 + w), in float32."""
    x = (2.0 * rng.standard_normal((4, 32))).astype(np.float32)
    plain = C.estimate_rstd(as_convention("torch"), x, 1e-5)
    for name, offset in (("gemma", 1.0), ("torch", 0.25)):
        weights = []

        def forward(x, n, w, eps, name=name, offset=offset, weights=weights):
            weights.append(w)
            return C.emulate(name, x, w, eps, offset=offset)

        r = C.estimate_rstd(forward, x, 1e-5, offset=offset)
        np.testing.assert_array_equal(weights[0], np.full(32, 1.0 - offset, np.float32))
        assert weights[0].dtype == F32
        np.testing.assert_array_equal(r, plain)


def test_estimate_rstd_gives_up_without_a_float32_run_or_a_usable_row(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)

    def refuses(x, n, w, eps):
        raise TypeError("no float32")

    assert C.estimate_rstd(refuses, x, 1e-5) is None
    x[3] = 0                                              # y/x is defined nowhere in row 3
    assert C.estimate_rstd(as_convention("torch"), x, 1e-5) is None
    x[3] = 1
    assert C.estimate_rstd(lambda x, n, w, eps: np.full(x.shape, np.inf, np.float32), x,
                           1e-5) is None


# ---- describe ------------------------------------------------------------------------------------


def test_describe_lists_every_convention_record_in_order():
    """Each convention: its name on a line of its own, then its formula, who uses it, its eps,
    output dtype and note, labelled; the notation first and the fused-add meanings last."""
    lines = C.describe().split("\n")
    assert lines[0].startswith("R_t = round to dtype t, f32 = upcast, x̂ = x·rstd, ")
    assert lines[0].endswith("rstd = 1/sqrt(mean(x²) + eps); mean(x²) in fp32 unless noted.")
    assert lines[1] == ""
    at = 2
    for c in C.CONVENTIONS.values():
        assert lines[at:at + 6] == [c.name, f"    y      : {c.formula}", f"    who    : {c.who}",
                                    f"    eps    : {c.eps_default}",
                                    f"    output : {c.out_dtype}", f"    note   : {c.notes}"]
        at += 6
    tail = lines[at:]
    assert tail[0] == "" and tail[1].startswith("fused residual add (emulate_add): ")
    assert "new_residual = R_res(h)" in tail[1]
    assert tail[2].split(":")[0].strip() == "rounded-sum" and "y = convention(R_in(h))" in tail[2]
    assert tail[2].endswith("(HF eager, Liger fused-add, llm.c)")
    assert tail[3].split(":")[0].strip() == "fp32-sum" and "y = R_in(convention_f32(h))" in tail[3]
    assert tail[3].endswith("(flash-attn, quack, vLLM native; single-rounding conventions)")
    assert len(tail) == 4

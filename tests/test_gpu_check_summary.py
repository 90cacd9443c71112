"""bench/gpu_check.py's verdict on the GPU speed target, from its timing rows (no GPU needed).

The target (>= 70 % of the device copy bandwidth for M·N >= 2^26) judges the automatic launch
configuration, the one a caller gets; the forced alternatives are timed beside it to compare.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _row(elems: int, automatic: bool, fwd: float, bwd: float) -> dict:
    return {"elems": elems, "automatic": automatic, "fwd_frac_copy": fwd, "bwd_frac_copy": bwd}


def _verdict(rows: list[dict]) -> list[str]:
    gc = _gpu_check()
    rep = gc.Report(timings=rows)
    gc._summarise_target(rep)
    return rep.notes


def test_the_target_judges_the_automatic_configuration_only():
    # a slow forced alternative (7 %) beside automatic rows at 40 % and 80 %: the worst is 40 %
    notes = _verdict([_row(2**26, True, 0.8, 0.9), _row(2**28, True, 0.6, 0.4),
                      _row(2**28, False, 0.07, 0.5)])
    assert len(notes) == 1 and "40 %" in notes[0] and "NOT met" in notes[0], notes


def test_the_target_ignores_shapes_below_two_to_the_26():
    notes = _verdict([_row(2**24, True, 0.1, 0.1), _row(2**26, True, 0.75, 0.71)])
    assert len(notes) == 1 and "71 %" in notes[0] and "(target 70 %: met)" in notes[0], notes


def test_no_verdict_without_a_timed_automatic_row():
    assert _verdict([_row(2**28, False, 0.9, 0.9), _row(2**24, True, 0.9, 0.9)]) == []

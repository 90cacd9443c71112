"""What a new user meets first: `python -m rmsref`, the notice while Numba compiles, the hint
naming the extra to install, the legend under `rmsref validate`'s table, 80-column help."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading

import pytest

from rmsref.commands import check as check_cmd
from rmsref.commands import validate as validate_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "rmsref", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_python_dash_m_rmsref_is_the_command(tmp_path):
    proc = _run("--help", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m rmsref")
    assert "check" in proc.stdout and "validate" in proc.stdout


@pytest.mark.parametrize("command", [(), ("check",)])
def test_help_fits_80_columns(command):
    proc = _run(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    long = [ln for ln in proc.stdout.splitlines() if len(ln) > 80]
    assert not long, long


def test_check_help_explains_half_precision_ratios():
    text = _run("check", "--help").stdout
    assert "~0.96" in text and "final rounding" in text


class _Bar:
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.said = threading.Event()

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.said.set()


def test_a_slow_numba_check_says_it_is_compiling(monkeypatch):
    monkeypatch.setattr(check_cmd, "_COMPILE_NOTICE_AFTER_S", 0.01)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    bar, noticed = _Bar(), set()
    check = check_cmd.Check("numba_cpu", "forward y float32", lambda: None)
    timer = check_cmd._compile_notice(check, bar, 2, noticed)
    assert bar.said.wait(5)
    timer.cancel()
    assert bar.notes == [
        f"compiling Numba kernels for numba_cpu (first run only, about "
        f"{2 * check_cmd._COMPILE_S_PER_DTYPE} s; cached on disk after)"]
    assert noticed == {"numba_cpu"}
    # said once per backend, and never for the oracle's own groups
    assert check_cmd._compile_notice(check, bar, 2, noticed) is None
    other = check_cmd.Check("gradcheck", "rms_norm", lambda: None)
    assert check_cmd._compile_notice(other, bar, 2, set()) is None


def test_a_fast_numba_check_says_nothing(monkeypatch):
    monkeypatch.setattr(check_cmd, "_COMPILE_NOTICE_AFTER_S", 30.0)
    bar = _Bar()
    timer = check_cmd._compile_notice(check_cmd.Check("numba_cpu", "y", lambda: None), bar, 1,
                                      set())
    timer.cancel()  # what run() does when the check returns
    timer.join(5)
    assert bar.notes == []


def test_notes_reach_a_pipe_as_plain_flushed_lines(capsys):
    from rmsref._progress import Output

    with Output(plain=True).progress(3, "rmsref check") as bar:  # stderr is not a terminal here
        bar.note("compiling Numba kernels for numba_cpu (first run only, about 30 s)")
    captured = capsys.readouterr()
    assert captured.err == "compiling Numba kernels for numba_cpu (first run only, about 30 s)\n"
    assert captured.out == ""


def test_validate_names_the_extra_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    parser = argparse.ArgumentParser()
    validate_cmd.add_arguments(parser)
    status = validate_cmd.run(parser.parse_args(["torch", "--no-progress"]))
    err = capsys.readouterr().err
    assert status == 2
    assert "pip install 'rmsref[torch]'" in err, err


def test_install_hint_only_for_what_an_extra_provides():
    assert validate_cmd._install_hint(ModuleNotFoundError("x", name="jax.numpy")) == (
        " (pip install 'rmsref[jax]')")
    assert validate_cmd._install_hint(ModuleNotFoundError("x", name="mypkg")) == ""


def test_validate_legend_counts_match_the_table():
    import rmsref
    from examples.float32_kernel import backward, forward

    report = rmsref.validate(forward, backward, dtypes=("float32",),
                             probes=("gaussian", "overflow", "underflow", "cancel"))
    table = report.table().splitlines()
    dashes = [i for i, ln in enumerate(table) if set(ln) == {"-"}]
    rows = table[dashes[0] + 1:dashes[1]]
    legend = validate_cmd._legend(report)
    n_rows = int(re.search(r"legend: (\d+) rows", legend).group(1))
    assert n_rows == len(rows)
    warn = re.search(r"not a failure: (\d+) rows, (\d+) checks\.", legend)
    n_warn_rows, n_warn_checks = map(int, warn.groups())
    assert n_warn_rows == sum(ln.rstrip().endswith("WARN") for ln in rows) == 2
    assert n_warn_checks == sum(c.advisory and not c.passed for c in report.cases)
    assert all(len(ln) <= 80 for ln in legend.splitlines()), legend


def test_the_test_suite_runs_without_pytest_xdist():
    """The default options ask for two pytest-xdist workers (-n 2 --dist loadfile); where
    pytest-xdist is not loaded, the tests run in one process and the header says why, rather
    than pytest stopping at "unrecognized arguments: -n"."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "tests/test_sumsq.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pytest-xdist is not loaded: the tests run in one process" in done.stdout
    assert re.search(r"\d+ passed", done.stdout)

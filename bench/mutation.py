"""Mutation testing of the modules that decide a number or a verdict, with mutmut.

    python bench/mutation.py --quick               # a fixed random sample of mutants (CI)
    python bench/mutation.py --full                # every mutant of every module (hours)
    python bench/mutation.py --full --module rmsref/_sumsq.py --module rmsref/tolerance.py
    python bench/mutation.py --full --module rmsref/_sumsq.py --tests tests/test_sumsq.py --keep
    python bench/mutation.py --rerun --workdir DIR   # the survivors again, against today's tests
                                                     # and code (and the test files written since)
    python bench/mutation.py --report --workdir DIR [--workdir DIR2 ...]  # one table of kept runs

A mutant is the package with one small change (``+`` for ``-``, ``<`` for ``<=``, a constant
nudged, an argument dropped). The tests *kill* it when at least one fails; a mutant that passes
every test *survives*: either the tests miss a behaviour, or the change cannot alter any result
(an *equivalent* mutant, listed with its reason in bench/mutation_equivalent.toml).

mutmut rewrites the package into ``mutants/`` and runs the tests there, so this script works in a
scratch copy of the tree (the checkout is never touched) and writes the table to
bench/results/mutation.md: per module, mutants generated, run, killed, survived, equivalent, and
every survivor with its diff. The modules and the tests they run against are the ``[tool.mutmut]``
section of pyproject.toml; mutmut runs, for each mutant, only the tests that call the mutated
function. Run it with ``nice``: it is one core for a long time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "mutation.md"
EQUIVALENT = ROOT / "bench" / "mutation_equivalent.toml"
#: mutant name -> module: "rmsref.tolerance.x_bound__mutmut_3",
#: "rmsref.rmsnorm.xǁ_ColumnSumǁadd__mutmut_1" (a method)
_MODULE = re.compile(r"^(?P<module>.+?)\.x(?:_|ǁ)")
#: Statuses of a mutant the tests caught: a failure or a hang (timeout). "no tests" (no test calls
#: the mutated code) and "survived" are not caught.
KILLED = ("killed", "timeout")
#: A crash or an unexpected exit code of the forked test run (SIGABRT, SIGSEGV, ...): not a test
#: failing, so not counted as caught. Its own column in the table, and rerun by --rerun: a crash
#: of the fork itself (a thread pool inherited from the parent) says nothing of the mutant.
CRASHED = ("suspicious", "segfault")


#: --quick samples from the oracle, the rounding, the tolerance model and the conventions,
#: against their own fast tests, so that generation, the test-coverage record and the sample fit
#: in a few minutes; gradcheck, identities and the Numba host code (slow tests) are --full only.
QUICK_MODULES = [
    "rmsref/rmsnorm.py", "rmsref/layernorm.py", "rmsref/unitnorm.py", "rmsref/_sumsq.py",
    "rmsref/_rounding.py", "rmsref/tolerance.py", "rmsref/conventions.py", "rmsref/comparison.py",
]
QUICK_TESTS = [
    "tests/test_rmsnorm.py", "tests/test_layernorm_unitnorm.py", "tests/test_add_rms_norm.py",
    "tests/test_column_sum.py", "tests/test_tolerance.py", "tests/test_bounds_tight.py",
    "tests/test_conventions.py", "tests/test_conventions_formulas.py",
    "tests/test_conventions_identify.py", "tests/test_out.py", "tests/test_mutation_survivors.py",
    "tests/test_sumsq.py", "tests/test_rounding.py", "tests/test_comparison.py",
    "tests/test_layernorm_properties.py", "tests/test_unitnorm_properties.py",
    "tests/test_comparison_options.py", "tests/test_comparison_bounds.py",
]


def configured_modules() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(conf["only_mutate"])


def _toml_list(key: str, values: list[str], text: str) -> str:
    listed = f"{key} = [\n" + "".join(f'    "{v}",\n' for v in values) + "]"
    return re.sub(rf"^{key} = \[.*?\]", listed, text, count=1, flags=re.S | re.M)


def scratch_copy(modules: list[str], tests: list[str] | None = None) -> Path:
    """The tracked and untracked (not ignored) files in a temporary folder, with only_mutate
    narrowed to ``modules`` (and the test selection to ``tests`` when given)."""
    work = Path(tempfile.mkdtemp(prefix="rmsref-mutation-"))
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (work / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / f)
    pyproject = work / "pyproject.toml"
    text = _toml_list("only_mutate", modules, pyproject.read_text())
    if tests:
        text = _toml_list("pytest_add_cli_args_test_selection", tests, text)
    pyproject.write_text(text)
    return work


#: mutmut forks one child per mutant from a process that has run the tests; a BLAS or OpenMP
#: thread pool alive at the fork can deadlock the child, which then reads as a timeout (a false
#: kill). One thread each: no pool to inherit. Numba's parallel kernels need more: its default
#: layer here is GNU OpenMP (TBB is not installed), whose pool aborts a forked child ("fork()
#: called from a process already using GNU OpenMP, this is unsafe", SIGABRT: "suspicious") even
#: with one thread; its "workqueue" layer resets itself in the child (pthread_atfork), the one
#: fork-safe layer Numba has on Linux without TBB.
FORK_SAFE = {**{v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                 "NUMBA_NUM_THREADS")},
             "NUMBA_THREADING_LAYER": "workqueue"}


def mutmut(work: Path, *args: str, check: bool = True) -> str:
    """``python -m mutmut ARGS`` in ``work``, fork-safe, with Numba's on-disk cache in the
    scratch copy: the kernels compiled by the first test run are loaded, not compiled again, by
    every later one (the mutated module's jitted bodies are never mutated, so never stale)."""
    env = {**os.environ, **FORK_SAFE, "NUMBA_CACHE_DIR": str(work / ".numba-cache")}
    run = subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, capture_output=True,
                         text=True, env=env)
    if check and run.returncode != 0:
        raise RuntimeError(f"mutmut {' '.join(args[:3])} failed ({run.returncode}):\n"
                           f"{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    return run.stdout


def statuses(work: Path) -> dict[str, str]:
    """mutant name -> mutmut's status ("killed", "survived", "timeout", "not checked", ...)."""
    out = mutmut(work, "results", "--all", "true")
    pairs = (line.strip().rsplit(": ", 1) for line in out.splitlines() if ": " in line)
    return {name: status for name, status in pairs}


def _dotted(path: str) -> str:
    """rmsref/kernels/numba_cpu.py -> rmsref.kernels.numba_cpu"""
    return path.removesuffix(".py").replace("/", ".")


def module_of(name: str) -> str:
    m = _MODULE.match(name)
    return m.group("module") if m else name.rsplit(".", 1)[0]


def generate(work: Path) -> list[str]:
    """Every mutant's name. mutmut generates them all before it filters, so a filter that
    matches nothing generates and stops (with an error we expect)."""
    mutmut(work, "run", "--max-children", "1", "rmsref.__nothing__*", check=False)
    names = sorted(statuses(work))
    if not names:
        raise RuntimeError("mutmut generated no mutants; see `mutmut run` in " + str(work))
    return names


def run(work: Path, names: list[str]) -> None:
    mutmut(work, "run", "--max-children", "1", *names)


def _fingerprint(values: list[str]) -> str:
    """mutmut's hash of a config list (``Config.config_fingerprint``)."""
    return hashlib.sha256(repr(tuple(values)).encode()).hexdigest()[:12]


def refresh_selection(work: Path, asked: list[str] | None = None) -> list[str]:
    """Add to a kept copy's test selection the files the checkout's selection names that the
    copy lacks (test files written since its run), and the files ``asked`` (--tests with
    --rerun: a wider selection for the survivors), keeping the copy's own narrowing otherwise;
    call it before refresh_tests. mutmut resets every verdict when the selection changes (its
    config fingerprint); more tests cannot revive a killed mutant, so the fingerprint it stored
    is set to the new selection instead, and mutmut collects only the new tests' stats."""
    key = "pytest_add_cli_args_test_selection"
    checkout = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"][key]
    pyproject = work / "pyproject.toml"
    old = tomllib.loads(pyproject.read_text())["tool"]["mutmut"][key]
    added = [t for t in checkout if t not in old and not (work / t).exists()]
    added += [t for t in asked or [] if t not in old and t not in added]
    if not added:
        return []
    stats_file = work / "mutants" / "mutmut-stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else None
    if stats and stats["config_fingerprint"]["test_selection"] != _fingerprint(old):
        raise RuntimeError(f"{stats_file}: test_selection fingerprint is not mutmut 3.8's hash "
                           "of the copy's selection; refusing to widen it")
    pyproject.write_text(_toml_list(key, old + added, pyproject.read_text()))
    if stats:
        stats["config_fingerprint"]["test_selection"] = _fingerprint(old + added)
        stats_file.write_text(json.dumps(stats, indent=4))
    return added


def refresh_sources(work: Path) -> None:
    """Copy the checkout's package over a kept scratch copy's, then let mutmut generate again:
    it keeps the verdicts of every function whose code is unchanged and resets (to "not
    checked") the mutants of a function that changed, which --rerun then runs."""
    for conf_path in tomllib.loads((work / "pyproject.toml").read_text())["tool"]["mutmut"][
            "source_paths"]:
        shutil.copytree(ROOT / conf_path, work / conf_path, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    generate(work)


def refresh_tests(work: Path) -> None:
    """Copy the checkout's tests over a kept scratch copy's (and mutmut's copy of them in
    ``mutants/``), so that --rerun judges old survivors by the tests written since. mutmut finds
    the new tests and records which functions they call before it runs a mutant."""
    for dest in (work / "tests", work / "mutants" / "tests"):
        if dest.is_dir():
            shutil.copytree(ROOT / "tests", dest, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


def diff_line(work: Path, name: str) -> str:
    """The changed line of a mutant, ``- old`` / ``+ new``, for the survivor list."""
    out = mutmut(work, "show", name, check=False)
    minus = [ln[1:].strip() for ln in out.splitlines() if ln.startswith("-") and
             not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in out.splitlines() if ln.startswith("+") and
            not ln.startswith("+++")]
    return f"`{' '.join(minus)}` → `{' '.join(plus)}`"


def table(generated: list[str], result: dict[str, str], equivalent: dict[str, str],
          where: dict[str, Path], mode: str, seconds: float) -> str:
    """The markdown table; ``where``: the scratch copy that ran each mutant (for its diff)."""
    ran = {n: result[n] for n in generated if result.get(n, "not checked") != "not checked"}
    lines = [
        "# Mutation testing",
        "",
        f"Written by `python bench/mutation.py {mode}`"
        + ("" if mode.startswith("--report") else f" in {seconds / 60:.1f} min")
        + " (see bench/mutation.py). *killed* includes timeouts "
        "(the tests took over 20x their usual CPU time: a hang, or a mutant that only slows "
        "the oracle down, such as smaller row chunks; counted as caught); "
        "*equivalent*: survivors that cannot change any result (reason below); "
        "*crashed*: the forked test run died (mutmut's \"suspicious\" or \"segfault\"), "
        "neither caught nor survived: not in the score, rerun them (`--rerun`); "
        "score = killed / (run − crashed − equivalent).",
        "",
        "| module | generated | run | killed | of which timeout | crashed | survived | equivalent "
        "| score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    per_module = Counter(module_of(n) for n in generated)
    survivors = []
    for module in sorted(per_module):
        mine = {n: s for n, s in ran.items() if module_of(n) == module}
        killed = sum(s in KILLED for s in mine.values())
        crashed = sum(s in CRASHED for s in mine.values())
        surv = [n for n, s in mine.items() if s not in KILLED + CRASHED]
        eq = [n for n in surv if n in equivalent]
        survivors += surv
        live = len(mine) - crashed - len(eq)
        score = f"{100 * killed / live:.0f} %" if live else "–"
        timeouts = sum(s == "timeout" for s in mine.values())
        lines.append(f"| {module} | {per_module[module]} | {len(mine)} | {killed} | {timeouts} | "
                     f"{crashed} | {len(surv) - len(eq)} | {len(eq)} | {score} |")
    not_run = len(generated) - len(ran)
    lines += ["", f"Not run: {not_run} of {len(generated)} mutants.", ""]
    if survivors:
        lines += ["## Survivors", "", "| mutant | change | status |", "|---|---|---|"]
        for n in sorted(survivors):
            why = equivalent.get(n)
            status = f"equivalent: {why}" if why else f"**survived** ({ran[n]})"
            lines.append(f"| {n} | {diff_line(where[n], n)} | {status} |")
        lines.append("")
    return "\n".join(lines)


#: Exit status of --quick when a sampled mutant survives (1 stays what a crash of the script
#: itself returns, so CI can tell the two apart).
SURVIVED = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="a fixed random sample of mutants")
    mode.add_argument("--full", action="store_true", help="every mutant (hours)")
    mode.add_argument("--rerun", action="store_true",
                      help="with --workdir: run its survivors (and the mutants no test reached, "
                           "whose test run crashed, or of a function changed since) again, "
                           "against the checkout's current tests and code")
    mode.add_argument("--report", action="store_true",
                      help="only write the table of what --workdir's runs have checked")
    parser.add_argument("--sample", type=int, default=24, help="mutants in --quick (24)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --quick sample")
    parser.add_argument("--module", action="append", default=None,
                        help="a module to mutate (repeatable; default: pyproject's only_mutate)")
    parser.add_argument("--tests", action="append", default=None,
                        help="a test file mutmut picks from (repeatable; default: --quick's "
                             "selection with --quick, pyproject's otherwise; with --rerun: "
                             "added to the kept copy's); a narrower selection is faster but "
                             "may let mutants survive that others kill")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    parser.add_argument("--workdir", type=Path, action="append", default=None,
                        help="reuse a scratch copy kept by --keep (its mutants and test stats); "
                             "--report takes several (copies that ran different modules)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="a paragraph for the table's header")
    args = parser.parse_args(argv)

    if (args.report or args.rerun) and not args.workdir:
        parser.error("--report and --rerun need --workdir (a scratch copy kept by --keep)")
    if args.workdir and len(args.workdir) > 1 and not args.report:
        parser.error("only --report takes more than one --workdir")
    quick = args.quick and not args.module
    modules = args.module or (QUICK_MODULES if quick else configured_modules())
    t0 = time.perf_counter()
    tests = args.tests or (QUICK_TESTS if quick else None)
    work = args.workdir[0] if args.workdir else scratch_copy(modules, tests)
    wanted = {_dotted(m) for m in modules}
    try:
        where = {}
        for w in args.workdir or [work]:
            mine = sorted(statuses(w)) if args.workdir else generate(w)
            where.update({n: w for n in mine if module_of(n) in wanted})
        names = sorted(where)
        chosen = names
        if args.quick:
            chosen = sorted(random.Random(args.seed).sample(names, min(args.sample, len(names))))
        if args.rerun:
            added = refresh_selection(work, args.tests)
            if added:
                print(f"test selection widened by {', '.join(added)}", flush=True)
            refresh_tests(work)
            refresh_sources(work)
            before = statuses(work)                  # the names, some new, and verdicts
            where = {n: work for n in before if module_of(n) in wanted}
            names = sorted(where)
            chosen = [n for n in names if before[n] in ("survived", "no tests", "not checked",
                                                        *CRASHED)]
        if args.report:
            chosen = []
        print(f"{len(names)} mutants generated in {len(modules)} modules; running {len(chosen)}",
              flush=True)
        if chosen:
            run(work, chosen)
        equivalent = tomllib.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
        result = {}
        for w in args.workdir or [work]:
            result.update(statuses(w))
        mode_str = (f"--quick --sample {args.sample} --seed {args.seed}" if args.quick
                    else "--report" if args.report else "--rerun" if args.rerun else "--full")
        if args.module:
            mode_str += "".join(f" --module {m}" for m in args.module)
        if args.tests:
            mode_str += "".join(f" --tests {t}" for t in args.tests)
        text = table(names, result, equivalent, where, mode_str, time.perf_counter() - t0)
        if args.note:
            text = text.replace("\n\n| module", f"\n\n{args.note}\n\n| module", 1)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(text)
        live = [n for n in chosen if result.get(n) not in KILLED + CRASHED and n not in equivalent]
        crashed = [n for n in chosen if result.get(n) in CRASHED]
        if crashed:
            print(f"{len(crashed)} mutant(s) whose test run crashed, neither caught nor survived "
                  "(rerun them with --rerun)", file=sys.stderr)
        if live:
            print(f"{len(live)} mutant(s) survived and are not marked equivalent", file=sys.stderr)
        return SURVIVED if live and args.quick else 0
    finally:
        if args.keep or args.workdir:
            print(f"scratch copy kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark of another revision beside this one's, in one run: `cdclake bench
--baseline REV` runs this checkout's steps, then the same steps and sizes from a copy of
revision REV's files on the same local stack and virtualenv, and prints both columns.

The baseline revision must run the same local stack (Apache Kafka and Kafka Connect) and
take the same command-line options; its figures come from its own report file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from cdclake_bench.report import FIGURES, TARGETS

REPO = Path(__file__).resolve().parents[2]
# figures where more is better besides the targets' `>=` ones (the others: less is)
HIGHER_IS_BETTER = {"throughput_merge_eps", "throughput_kafka_eps", "peer_one_call_ratio",
                    "naive_ratio"}  # fmt: skip


def checkout(rev: str, into: Path, repo: Path = REPO) -> Path:
    """The files of revision `rev` of `repo` (`git archive`), in a folder of `into` named
    by its commit; made once per commit."""
    commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = into / f"baseline-{commit[:12]}"
    if not (tree / "include" / "cdclake").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(repo), "archive", commit],
                                 capture_output=True, check=True, timeout=120).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True, timeout=120)
    return tree


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


def run_baseline(rev: str, work: Path, state_dir: Path, args: Sequence[str]) -> dict:
    """Revision `rev`'s benchmark report, run with `args` (scale, steps, sizes) from its
    files on the stack in `state_dir`. Its output goes to this process's."""
    work = work.resolve()
    tree = checkout(rev, work)
    out = work / "baseline.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cdclake", "bench", "--out", str(out),
           "--work", str(work / "baseline-work"), *args]  # fmt: skip
    path = os.pathsep.join(str(tree / d) for d in ("include", "tools", ""))
    env = {**os.environ, "PYTHONPATH": path, "CDCLAKE_STATE_DIR": str(state_dir.resolve())}
    print(f"[bench] the baseline {rev}: {' '.join(cmd[1:])} (in {tree})", flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    return json.loads(out.read_text())


def relative(name: str, baseline: float | None, this: float | None) -> float | None:
    """This revision's figure against the baseline's, as a factor where 1 is the same
    and above 1 is better (more where more is better, less where less is)."""
    if not baseline or not this:
        return None
    higher = TARGETS.get(name, ("",))[0] == ">=" or name in HIGHER_IS_BETTER
    return this / baseline if higher else baseline / this


def render_side_by_side(rev: str, baseline: Mapping[str, float | None],
                        this: Mapping[str, float | None]) -> str:  # fmt: skip
    """The figures of the baseline and of this revision, and how this one compares."""
    head = f"{'figure':24} {rev[:14]:>14} {'this':>14} {'vs baseline':>12}"
    lines = [head, "-" * len(head)]
    for name in FIGURES:
        old, new = baseline.get(name), this.get(name)
        factor = relative(name, old, new)
        lines.append(f"{name:24} {_num(old):>14} {_num(new):>14} "
                     f"{'-' if factor is None else f'{factor:.2f}x':>12}")  # fmt: skip
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "not measured" if value is None else f"{value:,.2f}"


def command(args) -> int:
    """`cdclake bench`: the benchmark, and with `--baseline` the same of another revision."""
    from cdclake_bench.runner import Sizes, run_bench

    # a SIGTERM (a CI job's timeout, `kill`) unwinds like Ctrl-C: each step's `finally`
    # stops what it started (the freshness step's Airflow processes)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    overrides = dict(item.split("=", 1) for item in args.size)
    sizes = Sizes.at_scale(args.scale).replace(overrides)
    report = run_bench(args.scale, Path(args.work), Path(args.out), args.only, sizes)
    if args.baseline:
        _with_baseline(args, report)
    return 0


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _with_baseline(args, report: dict) -> None:
    """Run revision `args.baseline`'s benchmark with the same steps and sizes, add its
    figures to the report and print both columns."""
    from cdclake_local.stack import StackSettings

    same = ["--scale", str(args.scale), *(["--only", *args.only] if args.only else [])]
    for item in args.size:
        same += ["--size", item]
    state_dir = StackSettings.from_env().state_dir
    base = run_baseline(args.baseline, Path(args.work), state_dir, same)
    report["baseline"] = {"revision": args.baseline, "figures": base["figures"]}
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render_side_by_side(args.baseline, base["figures"], report["figures"]))

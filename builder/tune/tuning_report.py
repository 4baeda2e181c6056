"""A tune's report for people: every setting tried as a table, and throughput against p99 with
the budget drawn, so the choice can be checked by eye and kept beside the tuning file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.tune.tuning_file import Trial, Tuning

TABLE = "tuning.md"
CHART = "tuning.png"


def trial_rows(tuning: Tuning) -> list[list[str]]:
    """One row per setting tried, best first: setting, req/s, p99, in flight, runs, mark."""
    ordered = sorted(tuning.trials, key=lambda t: (not t.within_budget, -t.rate, t.p99_ms))
    rows = []
    for trial in ordered:
        marks = [mark for mark, same in (("chosen", tuning.chosen), ("default", tuning.default))
                 if trial.setting == same.setting]
        rows.append([trial.setting.describe(), f"{trial.rate:.0f}", f"{trial.p99_ms:.1f}",
                     str(trial.concurrency), str(trial.measurements),
                     ", ".join(marks) or ("" if trial.within_budget else "over the budget")])
    return rows


HEADER = ["setting", "req/s", "p99 ms", "in flight", "runs", ""]


def summary(tuning: Tuning) -> str:
    gain = tuning.chosen.rate / tuning.default.rate if tuning.default.rate else float("inf")
    first = " to the first item" if tuning.streams else ""
    return (f"chosen: {tuning.chosen.setting.describe()} — {tuning.chosen.rate:.0f} req/s at p99 "
            f"{tuning.chosen.p99_ms:.1f} ms{first} ({gain:.2f}x the builder's defaults, "
            f"{tuning.default.rate:.0f} req/s), budget {tuning.latency_budget_ms:g} ms; "
            f"{len(tuning.trials)} settings in {tuning.search_s:.0f} s, spread "
            f"{tuning.spread:.1%}")


def write_report(tuning: Tuning, directory: Path) -> list[Path]:
    """``tuning.md`` (the table) and, where matplotlib is installed, ``tuning.png``."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"# Tuning of {tuning.subject or tuning.pipeline}", "", summary(tuning), "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in trial_rows(tuning)]
    if tuning.turns:
        lines += ["", "Told apart by turns (each turn serves both, back to back):", ""]
        lines += [f"- {t.first.describe()} against {t.second.describe()}: ahead in "
                  f"{t.first_ahead} and {t.second_ahead} of {t.count} turns"
                  for t in tuning.turns]
    table = directory / TABLE
    table.write_text("\n".join(lines) + "\n")
    written = [table]
    chart = _chart(tuning, directory / CHART)
    if chart is not None:
        written.append(chart)
    return written


def _chart(tuning: Tuning, path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    measured = [t for t in tuning.trials if t.rate > 0]
    axes.scatter([t.p99_ms for t in measured], [t.rate for t in measured], color="grey",
                 label="settings tried")
    for trial, colour, label in ((tuning.default, "tab:blue", "builder's defaults"),
                                 (tuning.chosen, "tab:green", "chosen")):
        _mark(axes, trial, colour, label)
    axes.axvline(tuning.latency_budget_ms, color="tab:red", linestyle="--",
                 label=f"budget {tuning.latency_budget_ms:g} ms")
    axes.set_xlabel(f"p99 latency to the {tuning.latency_of} (ms) at the load reaching the "
                    "most req/s within the budget")
    axes.set_ylabel("requests/s")
    axes.set_title(f"Tuning {tuning.subject or tuning.pipeline}")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def _mark(axes: Any, trial: Trial, colour: str, label: str) -> None:
    axes.scatter([trial.p99_ms], [trial.rate], color=colour, s=90, label=label, zorder=3)

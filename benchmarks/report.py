"""BENCHMARKS.md holds one section per benchmark, each written by the script that measured it."""

from __future__ import annotations

from pathlib import Path

from builder.tune.tuning_file import Machine

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def machine() -> str:
    """The machine a figure was measured on: architecture, CPUs and the CPU's model name.

    Why the model: machines of one kind are virtual and their CPUs differ from one to the next
    (per-call costs here differ by up to 2x between them), so figures from two sections are
    comparable only on the same CPU. Read as a tuning file records it (:class:`Machine`).
    """
    here = Machine.here()
    return f"{here.architecture}, {here.cpus} CPUs ({here.cpu_model})"


def write_section(heading: str, section: str, path: Path = BENCHMARKS) -> None:
    """Replace the section under ``heading`` (or append it), leaving the others alone.

    The file is read just before writing: other benchmarks write their own sections too.
    """
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = text.splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        lines[start:end] = section.rstrip("\n").splitlines() + [""]
    else:
        lines += ["", *section.rstrip("\n").splitlines()]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def publish(heading: str, section: str, *, write: bool = True) -> None:
    """Print a benchmark's section and, unless ``write`` is off, put it into BENCHMARKS.md."""
    print(section)
    if write:
        write_section(heading, section)

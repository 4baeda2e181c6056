"""``triton-builder``: the command line over the Python API.

Exit codes scripts can rely on: 0 success, 1 the work failed (build, push, verification,
inference), 2 bad usage or input, 3 the machine lacks something (no Docker engine, no wheel).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer
from rich.console import Console

app = typer.Typer(
    name="triton-builder",
    help="Turn a data pipeline into a Triton Inference Server deployment.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
base_app = typer.Typer(help="Base images: the Debian OS image and the CPU Triton base.",
                       no_args_is_help=True)
app.add_typer(base_app, name="base")

console = Console(stderr=True, highlight=False)
T = TypeVar("T")

EXIT_FAILED, EXIT_USAGE, EXIT_MACHINE = 1, 2, 3


def _run(step: str, work: Callable[[], T]) -> T:
    """Run ``work``, turning the errors we expect into one clear line and an exit code."""
    from builder.engine import EngineError
    from builder.host import HostError

    try:
        return work()
    except (EngineError, HostError) as error:
        console.print(f"[red]error[/red] {step}: {error}")
        raise typer.Exit(EXIT_MACHINE) from None
    except (ValueError, LookupError) as error:
        console.print(f"[red]error[/red] {step}: {error}")
        raise typer.Exit(EXIT_USAGE) from None
    except RuntimeError as error:
        console.print(f"[red]error[/red] {step}: {error}")
        raise typer.Exit(EXIT_FAILED) from None


def _log_line(line: str) -> None:
    console.print(line, markup=False, highlight=False)


@base_app.command("os")
def base_os(
    tag: str = typer.Option("triton-builder/debian-bookworm:python3.11", help="Image to make."),
    suite: str = typer.Option("bookworm", help="Debian suite."),
    rebuild: bool = typer.Option(False, help="Make it again even if it exists."),
) -> None:
    """Make a Debian OS image with Python 3.11 from Debian's packages (no registry needed).

    Example: triton-builder base os && triton-builder base cpu --os-image
    triton-builder/debian-bookworm:python3.11
    """
    from builder.engine import ensure_engine
    from builder.rootfs import debian_os_image

    made = _run("making the OS image",
                lambda: debian_os_image(ensure_engine(), tag=tag, suite=suite, rebuild=rebuild))
    print(made)


@base_app.command("cpu")
def base_cpu(
    os_image: str = typer.Option(
        None, help="Base OS image with Python "
        "[default: $TRITON_BUILDER_OS_IMAGE or python:3.11-slim-bookworm]"),
    python_version: str = typer.Option("3.11", "--python", help="Python of the OS image."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the build log."),
) -> None:
    """Build the CPU Triton base image; a second run with the same inputs takes seconds.

    Example: triton-builder base cpu --os-image triton-builder/debian-bookworm:python3.11
    """
    from builder.base import build_cpu_base
    from builder.engine import ensure_engine

    with console.status("building the CPU Triton base image"):
        image = _run("building the CPU base", lambda: build_cpu_base(
            ensure_engine(), os_image=os_image, python_version=python_version,
            on_log=_log_line if verbose else None))
    console.print(("built " if image.built else "up to date ") + image.tags[0])
    print(image.tags[0])

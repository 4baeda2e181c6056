"""``base os`` and ``base cpu``: the Debian OS image and our CPU Triton base, made here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.text import Text

from builder.base.cpu import build_cpu_base
from builder.base.os_image import debian_os_image
from builder.base.releases import DEBIAN_SUITES
from builder.cli.app import base_app, console, log_line, run_step
from builder.cli.command_options import parameter_default

if TYPE_CHECKING:  # the engine is imported only by the commands that use it
    from builder.engine.image_build import BuiltImage


@base_app.command("os")
def base_os(
    tag: str = typer.Option(None, help="Image to make "
                            "[default: triton-builder/debian-SUITE:pythonX.Y]"),
    suite: str = typer.Option(parameter_default(debian_os_image, "suite"), help="Debian suite: "
                              + " or ".join(f"{name} (Python {python})" for name, (python, *_)
                                            in DEBIAN_SUITES.items()) + "."),
    rebuild: bool = typer.Option(False, help="Make it again even if it exists."),
    platform: str = typer.Option(str(parameter_default(debian_os_image, "platform")),
                                 help="Platform: linux/amd64 or linux/arm64 (another than this "
                                      "machine's: under emulation)."),
) -> None:
    """Make a Debian OS image with its Python from Debian's packages (no registry needed).

    Example: triton-builder base os && triton-builder base cpu --os-image
    triton-builder/debian-bookworm:python3.11
    """
    from builder.engine import ensure_engine
    from builder.engine.emulation import require_platforms
    from builder.engine.platforms import parse_platform

    target = run_step("reading the options", lambda: parse_platform(platform))

    def make() -> str:
        client = ensure_engine()
        require_platforms(client, (target,))
        return debian_os_image(client, tag=tag, suite=suite, rebuild=rebuild, platform=target)

    made = run_step("making the OS image", make)
    print(made)


@base_app.command("cpu")
def base_cpu(
    os_image: str = typer.Option(
        None, help="Base OS image with Python [default: $TRITON_BUILDER_OS_IMAGE, else "
        "python:X.Y-slim-bookworm where the engine has it, else the one `base os` made, else "
        "python:X.Y-slim-bookworm pulled]"),
    python_version: str = typer.Option(parameter_default(build_cpu_base, "python_version"),
                                       "--python", help="Python of the OS image."),
    rebuild: bool = typer.Option(False, help="Build from scratch (no reuse, no layer cache)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the build log."),
    platform: str = typer.Option(str(parameter_default(build_cpu_base, "platform")),
                                 help="Platform: linux/amd64 or linux/arm64 (its OS image must "
                                      "be of that platform)."),
) -> None:
    """Build the CPU Triton base image; a second run with the same inputs takes seconds.

    Example: triton-builder base cpu --os-image triton-builder/debian-bookworm:python3.11
    """
    from builder.engine import ensure_engine
    from builder.engine.emulation import require_platforms
    from builder.engine.platforms import parse_platform

    target = run_step("reading the options", lambda: parse_platform(platform))

    def build() -> BuiltImage:
        client = ensure_engine()
        require_platforms(client, (target,))
        return build_cpu_base(client, os_image=os_image, python_version=python_version,
                              rebuild=rebuild, platform=target,
                              on_log=log_line if verbose else None)

    with console.status(Text(f"building the CPU Triton base image for {target}")):
        image = run_step("building the CPU base", build)
    console.print(("built " if image.built else "up to date ") + image.tags[0])
    print(image.tags[0])

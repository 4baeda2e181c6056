"""``doctor``: what this machine has and lacks for the builds it is asked about."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text

from builder.cli.app import EXIT_MACHINE, app, console, fail, run_step
from builder.cli.command_options import parameter_default
from builder.doctor import run_checks


@app.command()
def doctor(
    cuda: str = typer.Option(parameter_default(run_checks, "cuda"),
                             help="The CUDA version you plan to build for."),
    slim: bool = typer.Option(parameter_default(run_checks, "slim"),
                              help="For the slim GPU route (image --slim)."),
    environment: Path = typer.Option(None, help="A packed environment (.tar.gz) whose CUDA "
                                                "runtime to check against the driver."),
    remove_leftovers: bool = typer.Option(False, "--remove-leftovers",
                                          help="Remove the containers (and their untagged "
                                               "images) of builds that were killed, and the "
                                               "cache entries they left half-written."),
) -> None:
    """Check this machine: Docker engine, NVIDIA container runtime, driver against the
    release's minimum and an environment's CUDA runtime, disk, base image, and what builds
    that were killed (SIGKILL) left on the engine and in the cache.

    Example: triton-builder doctor --cuda 12.6 --environment env.tar.gz
    """
    from builder.base.releases import resolve

    run_step("reading the options", lambda: resolve(cuda, slim=slim))
    checks = run_checks(cuda, environment, slim=slim, remove_leftovers=remove_leftovers)
    for check in checks:
        color = {"ok": "green", "warn": "yellow", "fail": "red"}[check.status]
        console.print(Text.assemble((f"{check.status:<4}", color),
                                    f" {check.name}: {check.detail}"))
    failed = [check.name for check in checks if check.status == "fail"]
    if failed:
        fail("checking this machine", f"{', '.join(failed)} failed (see above)", EXIT_MACHINE)

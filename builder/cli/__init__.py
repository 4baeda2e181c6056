"""``triton-builder``: the command line over the Python API, one module per command group.

``app`` holds the application, the console and the exit codes; ``command_options`` the build
commands' options, defined once with the library's defaults; ``build_commands`` (build, image,
push), ``serve_commands`` (serve, infer, inspect), ``base_commands`` (base os, base cpu),
``deploy_commands`` (deploy swarm, deploy k8s), ``doctor_command`` and ``tune_command`` the
commands.
"""

from builder.cli import (  # noqa: F401 - importing a command module registers its commands
    base_commands,
    build_commands,
    deploy_commands,
    doctor_command,
    serve_commands,
    tune_command,
)
from builder.cli.app import app, main
from builder.cli.pipeline_loading import load_pipeline

__all__ = ["app", "load_pipeline", "main"]

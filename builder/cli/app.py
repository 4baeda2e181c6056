"""The ``triton-builder`` application: its command groups, the console, and how a command's
failure becomes one error line and a documented exit code.

Exit codes scripts can rely on: 0 success, 1 the work failed (build, push, verification,
inference, a server that does not answer), 2 bad usage or input, 3 the machine lacks something
(no Docker engine, no wheel), 130 interrupted (SIGINT), 143 terminated (SIGTERM) — after
removing what the command had made. Results go to standard output (one line, or JSON); progress
and errors go to standard error. Every message is printed as written — never read as rich markup,
so ``[batch, 8]`` stays in it — and every error is one line, the last: ``error <step>: <cause>``
with the fix where there is one (details such as a log tail go above it).
``TRITON_BUILDER_TRACEBACK=1`` lets an unexpected exception through with its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(
    name="triton-builder",
    help="Turn a data pipeline into a Triton Inference Server deployment.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
base_app = typer.Typer(help="Base images: the Debian OS image and the CPU Triton base.",
                       no_args_is_help=True, rich_markup_mode=None)
app.add_typer(base_app, name="base")
deploy_app = typer.Typer(help="Deploy a serving image: Docker Swarm stacks, Kubernetes / KServe.",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(deploy_app, name="deploy")

console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
T = TypeVar("T")

EXIT_FAILED, EXIT_USAGE, EXIT_MACHINE = 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
TRACEBACK_VARIABLE = "TRITON_BUILDER_TRACEBACK"


@app.callback()
def _take_interrupts() -> None:
    from builder.interrupts import take_interrupts

    take_interrupts()  # for good: a signal while the command cleans up and exits is ignored


def main(args: Sequence[str] | None = None) -> NoReturn:
    """The ``triton-builder`` console script: the commands, with click's usage errors and
    anything no command caught reported as one ``error`` line too."""
    try:  # typer vendors click as typer._click from 0.22; before, it raised click's own
        from typer.exceptions import TyperException as CommandLineError
    except ImportError:
        from click.exceptions import ClickException as CommandLineError

    command = typer.main.get_command(app)
    try:
        try:
            code = command.main(args=args, prog_name="triton-builder", standalone_mode=False)
        except CommandLineError as error:  # usage errors: unknown options, missing arguments
            context = getattr(error, "ctx", None)
            where = f" (see {context.command_path} --help)" if context is not None else ""
            fail("", f"{error.format_message()}{where}", error.exit_code)
        except typer.Abort:
            fail("", "interrupted", EXIT_INTERRUPTED)
        except typer.Exit:
            raise
        except Exception as error:  # noqa: BLE001 - a command's own step did not catch it
            report_error("", error)
    except typer.Exit as stop:
        code = stop.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def run_step(step: str, work: Callable[[], T]) -> T:
    """Run ``work``; a failure becomes one ``error <step>: ...`` line and its exit code."""
    from builder.interrupts import Terminated

    try:
        return work()
    except typer.Exit:
        raise
    except KeyboardInterrupt as interrupt:  # the work removed what it had made on its way out
        terminated = isinstance(interrupt, Terminated)
        fail(step, "terminated" if terminated else "interrupted",
              EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    except Exception as error:  # noqa: BLE001 - classified by _exit_code
        report_error(step, error)


def report_error(step: str, error: BaseException) -> NoReturn:
    """Print ``error`` for ``step`` and exit with the code of its category."""
    if os.environ.get(TRACEBACK_VARIABLE) == "1":
        raise error
    code = exit_code(error)
    message = str(error).strip() or type(error).__name__
    if isinstance(error, ConnectionError):
        message += "; is a server listening there? (triton-builder serve IMAGE starts one)"
    elif code == EXIT_FAILED and not isinstance(error, (RuntimeError, OSError, TimeoutError)):
        message = (f"{type(error).__name__}: {message} (unexpected: "
                   f"{TRACEBACK_VARIABLE}=1 prints where it happened)")
    fail(step, message, code)


def exit_code(error: BaseException) -> int:
    """The documented exit code of an error's category."""
    from builder.engine import EngineError
    from builder.host_packages import HostError
    from builder.tritonserver.wheel import DistributionError

    if isinstance(error, (EngineError, HostError, DistributionError)):
        return EXIT_MACHINE
    if isinstance(error, (ConnectionError, TimeoutError)):
        return EXIT_FAILED
    if isinstance(error, (ValueError, LookupError)):
        return EXIT_USAGE
    return EXIT_FAILED


def fail(step: str, message: str, code: int) -> NoReturn:
    """Details (a message's lines after its first) above, then the one error line; exit."""
    first, *details = message.splitlines() or [""]
    for line in details:
        console.print(line)
    if details and first.endswith(":"):
        first = f"{first[:-1]} (details above)"
    console.print(Text.assemble(("error", "red"), f" {step}: " if step else ": ", first))
    raise typer.Exit(code)


def log_line(line: str) -> None:
    console.print(line)



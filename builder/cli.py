"""``triton-builder``: the command line over the Python API.

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

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

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
            _fail("", f"{error.format_message()}{where}", error.exit_code)
        except typer.Abort:
            _fail("", "interrupted", EXIT_INTERRUPTED)
        except typer.Exit:
            raise
        except Exception as error:  # noqa: BLE001 - a command's own step did not catch it
            _report("", error)
    except typer.Exit as stop:
        code = stop.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def _run(step: str, work: Callable[[], T]) -> T:
    """Run ``work``; a failure becomes one ``error <step>: ...`` line and its exit code."""
    from builder.interrupts import Terminated

    try:
        return work()
    except typer.Exit:
        raise
    except KeyboardInterrupt as interrupt:  # the work removed what it had made on its way out
        terminated = isinstance(interrupt, Terminated)
        _fail(step, "terminated" if terminated else "interrupted",
              EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    except Exception as error:  # noqa: BLE001 - classified by _exit_code
        _report(step, error)


def _report(step: str, error: BaseException) -> NoReturn:
    """Print ``error`` for ``step`` and exit with the code of its category."""
    if os.environ.get(TRACEBACK_VARIABLE) == "1":
        raise error
    code = _exit_code(error)
    message = str(error).strip() or type(error).__name__
    if isinstance(error, ConnectionError):
        message += "; is a server listening there? (triton-builder serve IMAGE starts one)"
    elif code == EXIT_FAILED and not isinstance(error, (RuntimeError, OSError, TimeoutError)):
        message = (f"{type(error).__name__}: {message} (unexpected: "
                   f"{TRACEBACK_VARIABLE}=1 prints where it happened)")
    _fail(step, message, code)


def _exit_code(error: BaseException) -> int:
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


def _fail(step: str, message: str, code: int) -> NoReturn:
    """Details (a message's lines after its first) above, then the one error line; exit."""
    first, *details = message.splitlines() or [""]
    for line in details:
        console.print(line)
    if details and first.endswith(":"):
        first = f"{first[:-1]} (details above)"
    console.print(Text.assemble(("error", "red"), f" {step}: " if step else ": ", first))
    raise typer.Exit(code)


def _log_line(line: str) -> None:
    console.print(line)


@base_app.command("os")
def base_os(
    tag: str = typer.Option(None, help="Image to make "
                            "[default: triton-builder/debian-SUITE:pythonX.Y]"),
    suite: str = typer.Option("bookworm", help="Debian suite: bookworm (Python 3.11) or "
                              "trixie (3.13)."),
    rebuild: bool = typer.Option(False, help="Make it again even if it exists."),
    platform: str = typer.Option("linux/amd64", help="Platform: linux/amd64 or linux/arm64 "
                                 "(another than this machine's: under emulation)."),
) -> None:
    """Make a Debian OS image with its Python from Debian's packages (no registry needed).

    Example: triton-builder base os && triton-builder base cpu --os-image
    triton-builder/debian-bookworm:python3.11
    """
    from builder.base.os_image import debian_os_image
    from builder.engine import ensure_engine
    from builder.engine.emulation import require_platforms
    from builder.engine.platforms import parse_platform

    target = _run("reading the options", lambda: parse_platform(platform))

    def make() -> str:
        client = ensure_engine()
        require_platforms(client, (target,))
        return debian_os_image(client, tag=tag, suite=suite, rebuild=rebuild, platform=target)

    made = _run("making the OS image", make)
    print(made)


@base_app.command("cpu")
def base_cpu(
    os_image: str = typer.Option(
        None, help="Base OS image with Python [default: $TRITON_BUILDER_OS_IMAGE, else "
        "python:X.Y-slim-bookworm where the engine has it, else the one `base os` made, else "
        "python:X.Y-slim-bookworm pulled]"),
    python_version: str = typer.Option("3.11", "--python", help="Python of the OS image."),
    rebuild: bool = typer.Option(False, help="Build from scratch (no reuse, no layer cache)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Stream the build log."),
    platform: str = typer.Option("linux/amd64", help="Platform: linux/amd64 or linux/arm64 "
                                 "(its OS image must be of that platform)."),
) -> None:
    """Build the CPU Triton base image; a second run with the same inputs takes seconds.

    Example: triton-builder base cpu --os-image triton-builder/debian-bookworm:python3.11
    """
    from builder.base.cpu import build_cpu_base
    from builder.engine import ensure_engine
    from builder.engine.emulation import require_platforms
    from builder.engine.platforms import parse_platform

    target = _run("reading the options", lambda: parse_platform(platform))

    def build() -> object:
        client = ensure_engine()
        require_platforms(client, (target,))
        return build_cpu_base(client, os_image=os_image, python_version=python_version,
                              rebuild=rebuild, platform=target,
                              on_log=_log_line if verbose else None)

    with console.status(Text(f"building the CPU Triton base image for {target}")):
        image = _run("building the CPU base", build)
    console.print(("built " if image.built else "up to date ") + image.tags[0])
    print(image.tags[0])


# -- pipelines → repository → image ----------------------------------------------------------
PIPELINE_HELP = "The pipeline: 'path/to/file.py:attr' or 'package.module:attr'."
BUDGET_HELP = ("Latency budget of a request: what would wait longer in a queue is refused "
               "at once with UNAVAILABLE (queue policies).")
MAX_REQUEST_HELP = ("The largest request served, in MiB; a larger one is answered "
                    "INVALID_ARGUMENT / 400 [default: 16, or 64x the largest example].")


def _request_bytes(mib: float | None) -> int | None:
    return None if mib is None else max(1, round(mib * 1024 * 1024))


@app.command()
def build(
    pipeline: str = typer.Argument(..., help=PIPELINE_HELP),
    model_root: Path = typer.Option(Path("models"), help="Where to write the repository."),
    format_priority: list[str] = typer.Option(["onnx"], "--format",
                                              help="Export formats, in order (repeatable)."),
    parallelism: int = typer.Option(1, help="Instances of the pipeline model."),
    cuda: str = typer.Option(None, help="Place models for this CUDA version's release (GPU "
                                        "instances), or 'cpu' (CPU instances)."),
    latency_budget_ms: float = typer.Option(None, min=0.001, help=BUDGET_HELP),
    max_request_mb: float = typer.Option(None, min=0.001, help=MAX_REQUEST_HELP),
) -> None:
    """Write the Triton model repository of a pipeline.

    Example: triton-builder build pipelines/text_embedding.py:pipeline --model-root models
    """
    from builder.base.releases import resolve
    from builder.repository.writer import build_pipeline_model

    pipe = _run("loading the pipeline", lambda: load_pipeline(pipeline))
    target = _run("choosing the release", lambda: resolve(cuda)) if cuda else None
    result = _run("building the repository", lambda: build_pipeline_model(
        pipe, model_root, format_priority, parallelism, target=target,
        latency_budget_ms=latency_budget_ms, max_request_bytes=_request_bytes(max_request_mb)))
    console.print(result.report())
    print(result.model_root)


@app.command()
def image(
    pipeline: str = typer.Argument(..., help=PIPELINE_HELP),
    tag: list[str] = typer.Option(..., "--tag", "-t", help="Image name (repeatable)."),
    cuda: str = typer.Option("cpu", help="CUDA version (e.g. 11.8), or 'cpu'."),
    slim: bool = typer.Option(False, help="The slim GPU route for --cuda (12.x, 13.0): the "
                              "nvidia-pytriton wheel's Triton on Debian, CUDA libraries from "
                              "NVIDIA's wheels, no NGC image."),
    triton_version: str = typer.Option(None, help="Pick the Triton release by its version."),
    base_image: str = typer.Option(None, help="Use this base image instead."),
    env: list[Path] = typer.Option([], exists=True, dir_okay=False,
                                   help="Environment spec in envs/ (repeatable)."),
    requirement: list[str] = typer.Option([], "--requirement", "-r",
                                           help="Extra pip requirement (repeatable)."),
    parallelism: int = typer.Option(1, min=1, help="Instances of the pipeline model (each runs "
                                    "its Python operators on one core)."),
    verify: bool = typer.Option(True, help="Run the image and compare with the pipeline."),
    push: bool = typer.Option(False, help="Push every tag after the build."),
    user: str = typer.Option(None, help="Run the server as this user [default: uid 1000; "
                             "'root' for root]."),
    drain_seconds: float = typer.Option(5.0, min=0, max=300, help="How long a stopping "
                                        "container serves on after its readiness failed."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Build every layer of the image "
                                  "again (docker build --no-cache): reuse nothing the engine "
                                  "holds from an earlier build."),
    latency_budget_ms: float = typer.Option(None, min=0.001, help=BUDGET_HELP),
    max_request_mb: float = typer.Option(None, min=0.001, help=MAX_REQUEST_HELP),
    pytorch_index: str = typer.Option(
        "https://download.pytorch.org/whl",
        help="PyTorch's wheel indexes (<url>/cu124, <url>/cpu); 'none' to use only the "
             "package index, choosing torch by each wheel's CUDA runtime."),
    bridge: bool = typer.Option(True, help="Serve this Python on a release whose Python "
                                "differs (a stub and an environment carrying the interpreter)."),
    base_python: str = typer.Option(None, help="Python of the CPU base: 3.11 (bookworm, "
                                    "default) or 3.13 (trixie)."),
    interpreter_image: str = typer.Option(None, help="Image the bridged interpreter is taken "
                                          "from [default: python:X.Y-slim-<debian>]."),
    compile_stub: bool = typer.Option(False, help="Compile the stub from the release's "
                                      "python_backend branch even where a wheel has one."),
    triton_sources: Path = typer.Option(None, exists=True, file_okay=False,
                                        help="Directory of python_backend source tarballs "
                                             "(instead of fetching them)."),
    platform: list[str] = typer.Option([], "--platform", help="Platform to build for "
                                       "(repeatable: linux/amd64, linux/arm64; one tag, one "
                                       "index at push) [default: linux/amd64]."),
    no_verify_platform: list[str] = typer.Option([], "--no-verify-platform", help="Build this "
                                                 "platform without verifying it (a warning; "
                                                 "repeatable)."),
) -> None:
    """Build (and verify, and push) the serving image of a pipeline.

    Example: triton-builder image pipelines/text_embedding.py:pipeline -t embed:1 --cuda 11.8;
    --platform linux/amd64 --platform linux/arm64 builds both under one tag.
    """
    from dataclasses import replace

    from builder.engine.platforms import parse_platforms

    _run("reading the options", lambda: parse_platforms([*platform, *no_verify_platform]))
    from builder.engine import ensure_engine
    from builder.job import build_docker_image

    pipe = _run("loading the pipeline", lambda: load_pipeline(pipeline))
    first, *others = tag
    built = _run("building the image", lambda: build_docker_image(
        pipe, first, tags=others, cuda=cuda, slim=slim, triton_version=triton_version,
        base_image=base_image, env_specs=env, requirements=requirement, verify=verify,
        push=push, user=user, drain_s=drain_seconds, no_cache=no_cache,
        client=ensure_engine(),
        parallelism=parallelism, latency_budget_ms=latency_budget_ms,
        max_request_bytes=_request_bytes(max_request_mb),
        pytorch_index=None if pytorch_index.lower() == "none" else pytorch_index,
        bridge=bridge, base_python=base_python, interpreter_image=interpreter_image,
        compile_stub=compile_stub, triton_sources=triton_sources,
        platforms=platform or None, no_verify_platforms=no_verify_platform))
    for name, each in (built.platform_images or {"": replace(built, pushed={})}).items():
        console.print(("built " if each.built else "up to date ") + ", ".join(each.tags)
                      + (f" ({name})" if name else ""))
        for pushed in each.pushed.values():
            console.print(f"pushed {pushed.pinned}")
    for pushed in built.pushed.values():
        console.print(f"pushed {pushed.pinned}" + (
            f" (image index: {', '.join(built.platform_images)})" if built.platform_images
            else ""))
    print(built.tags[0])


@app.command()
def push(
    reference: str = typer.Argument(..., help="Image to push (registry/name:tag)."),
    retries: int = typer.Option(3, help="Retries of transient failures."),
) -> None:
    """Push an image and print the digest the registry confirmed.

    Example: triton-builder push localhost:5000/embed:1
    """
    from builder.engine import ensure_engine
    from builder.push.docker_push import push_image

    result = _run("pushing", lambda: push_image(ensure_engine(), reference, retries=retries,
                                                on_log=_log_line))
    print(result.pinned)


# -- running and calling ------------------------------------------------------------------------
@app.command()
def serve(
    reference: str = typer.Argument(..., help="Image to run."),
    http_port: int = typer.Option(8000, help="Host port for HTTP."),
    grpc_port: int = typer.Option(8001, help="Host port for gRPC."),
    metrics_port: int = typer.Option(8002, help="Host port for metrics."),
    detach: bool = typer.Option(False, help="Leave it running and print the container id."),
    timeout: float = typer.Option(180.0, help="Seconds to wait for readiness."),
) -> None:
    """Run an image, wait until Triton is ready and print its endpoints.

    Example: triton-builder serve embed:1 --detach && triton-builder infer
    grpc://127.0.0.1:8001/pipeline --input text=hello
    """
    from builder.engine import ensure_engine
    from builder.verify.container import ServingContainer

    container = _run("starting the server", lambda: ServingContainer(
        ensure_engine(), reference, host_ports=(http_port, grpc_port, metrics_port)))
    try:
        endpoint = container.start(timeout)
    except Exception as error:  # noqa: BLE001 - its log first, then the one error line
        console.print(container.logs()[-4000:])
        container.remove()
        _report("starting the server", error)
    console.print(f"ready: grpc://{endpoint.grpc_url}  http://{endpoint.http_url}  "
                  f"metrics http://{endpoint.metrics_url}/metrics")
    if detach:
        console.print(f"stop it with: docker rm -f {container.container.short_id}")
        print(container.container.id)
        return
    try:
        for line in container.container.logs(stream=True, follow=True):
            sys.stderr.write(line.decode(errors="replace"))
    except KeyboardInterrupt:
        pass
    finally:
        container.remove()


@app.command()
def infer(
    url: str = typer.Argument(..., help="grpc://host:8001/model or http://host:8000/model"),
    input: list[str] = typer.Option([], "--input", "-i",
                                    help="name=value; JSON values parse, @file reads bytes."),
) -> None:
    """Call a served model or pipeline once and print its outputs as JSON.

    Example: triton-builder infer grpc://127.0.0.1:8001/pipeline -i text="hello world"
    """
    from builder.client.pipeline import Client

    values = _run("reading the inputs", lambda: dict(_parse_input(item) for item in input))
    with _run("reading the URL", lambda: Client(url)) as client:
        columns = _run("reading the model", lambda: _pipeline_inputs(client))
        if columns is None:
            result = _run("inference", lambda: client.model(**values))
        else:
            missing = [c for c in columns if c not in values]
            if missing or set(values) - set(columns):
                _fail("reading the inputs", f"the pipeline takes inputs {columns}; got "
                      f"{sorted(values)}: give each with -i name=value", EXIT_USAGE)
            result = _run("inference", lambda: client(*(values[c] for c in columns)))
    print(json.dumps(_jsonable(result), ensure_ascii=False))


@app.command()
def inspect(
    reference: str = typer.Argument(..., help="Image to describe."),
    sbom: bool = typer.Option(False, "--sbom", help="Print the image's bill of materials "
                              "(CycloneDX JSON) instead of its labels."),
    inputs: bool = typer.Option(False, "--inputs", help="Print what the image was made from "
                                "(the same inputs give the same image ID)."),
) -> None:
    """Show what an image serves: signature, Triton, CUDA, environment (from its labels).

    Example: triton-builder inspect embed:1; triton-builder inspect embed:1 --sbom
    """
    from builder.engine import ensure_engine
    from builder.image.labels import PLATFORMS, image_inputs

    if sbom:
        print(_run("reading the bill of materials",
                   lambda: _image_sbom(ensure_engine(), reference)), end="")
        return
    labels = _run("reading the image", lambda: _image_labels(ensure_engine(), reference))
    if inputs:
        print(json.dumps(image_inputs(labels), indent=2, sort_keys=True))
        return
    ours = {key: value for key, value in labels.items()
            if key.startswith(("ai.triton-builder.", "org.opencontainers.image."))}
    for key, value in ours.items():
        if key.endswith(".signature"):
            ours[key] = json.loads(value)
    if PLATFORMS in labels:
        ours["platforms"] = _run("reading the platforms' images",
                                 lambda: _platform_images(ensure_engine(), reference, labels))
    print(json.dumps(ours, indent=2, sort_keys=True))


@app.command()
def doctor(
    cuda: str = typer.Option("cpu", help="The CUDA version you plan to build for."),
    slim: bool = typer.Option(False, help="For the slim GPU route (image --slim)."),
    environment: Path = typer.Option(None, help="A packed environment (.tar.gz) whose CUDA "
                                                "runtime to check against the driver."),
    remove_leftovers: bool = typer.Option(False, "--remove-leftovers",
                                          help="Remove the containers (and their untagged "
                                               "images) of builds that were killed."),
) -> None:
    """Check this machine: Docker engine, NVIDIA container runtime, driver against the
    release's minimum and an environment's CUDA runtime, disk, base image, and what builds
    that were killed (SIGKILL) left on the engine.

    Example: triton-builder doctor --cuda 12.6 --environment env.tar.gz
    """
    from builder.base.releases import resolve
    from builder.doctor import run_checks

    _run("reading the options", lambda: resolve(cuda, slim=slim))
    checks = run_checks(cuda, environment, slim=slim, remove_leftovers=remove_leftovers)
    for check in checks:
        color = {"ok": "green", "warn": "yellow", "fail": "red"}[check.status]
        console.print(Text.assemble((f"{check.status:<4}", color),
                                    f" {check.name}: {check.detail}"))
    failed = [check.name for check in checks if check.status == "fail"]
    if failed:
        _fail("checking this machine", f"{', '.join(failed)} failed (see above)", EXIT_MACHINE)


# -- deploying ----------------------------------------------------------------------------------
@deploy_app.command("swarm")
def deploy_swarm_command(
    reference: str = typer.Argument(..., help="Serving image (built by triton-builder)."),
    replicas: int = typer.Option(2, help="Replicas of the server."),
    name: str = typer.Option("triton", help="Stack name."),
    shm_size: str = typer.Option("1g", help="/dev/shm of each replica (the python backend's)."),
    publish: str = typer.Option("ingress", help="'ingress' (routing mesh) or 'host' (each "
                                                "replica on its own host ports)."),
    http_port: int = typer.Option(8000, help="Published HTTP port (0: random, host mode)."),
    grpc_port: int = typer.Option(8001, help="Published gRPC port (0: random, host mode)."),
    metrics_port: int = typer.Option(8002, help="Published metrics port (0: random, host mode)."),
    health_interval: int = typer.Option(15, help="Seconds between health checks."),
    health_retries: int = typer.Option(3, help="Failed checks before a replica is unhealthy."),
    stack_file: Path = typer.Option(None, help="Keep the stack (compose) file here."),
    dry_run: bool = typer.Option(False, help="Print the stack file; deploy nothing."),
    wait: float = typer.Option(300.0, help="Seconds to wait for every replica to be healthy "
                                           "(0: do not wait)."),
) -> None:
    """Deploy (or update, rolling and start-first) a serving image as a Docker Swarm stack.

    Example: triton-builder deploy swarm registry:5000/embed:2 --replicas 3
    """
    from builder.deploy.serving import deployable_image
    from builder.deploy.swarm import SwarmOptions, deploy_swarm, stack_document, write_stack
    from builder.engine import ensure_engine

    ports = tuple(port or None for port in (http_port, grpc_port, metrics_port))
    options = _run("reading the options", lambda: SwarmOptions(
        replicas=replicas, shm_size=shm_size, publish=publish, ports=ports,
        health_interval_s=health_interval, health_retries=health_retries))
    if dry_run:
        from builder.engine import EngineError, docker_client

        try:
            engine = docker_client()
        except EngineError:
            engine = None  # no engine here: described without its labels (a CPU image)
        image = _run("reading the image", lambda: deployable_image(reference, client=engine))
        document = stack_document(image, options)
        if stack_file is not None:
            write_stack(document, stack_file)
        import yaml

        print(yaml.safe_dump(document, sort_keys=False), end="")
        return
    client = _run("reaching the engine", ensure_engine)
    image = _run("reading the image", lambda: deployable_image(reference, client=client))
    with console.status(Text(f"deploying {reference} as stack {name}")):
        _run("deploying", lambda: deploy_swarm(image, name, options, client=client,
                                               stack_file=stack_file, wait=wait or None))
    console.print(f"stack {name}: {replicas} replica(s) of {reference}"
                  + (" healthy" if wait else " deploying"))
    print(name)


@deploy_app.command("k8s")
def deploy_k8s_command(
    reference: str = typer.Argument(..., help="Serving image (as the cluster pulls it)."),
    name: str = typer.Option("triton", help="Name of the Deployment, Service, HPA."),
    namespace: str = typer.Option(None, help="Namespace of the objects."),
    replicas: int = typer.Option(2, help="Replicas to start with."),
    min_replicas: int = typer.Option(2, help="Autoscaler minimum."),
    max_replicas: int = typer.Option(8, help="Autoscaler maximum."),
    gpu: bool = typer.Option(None, "--gpu/--cpu", help="Ask for GPUs [default: from the "
                                                       "image's labels where it is local]"),
    kserve: bool = typer.Option(False, help="Write a KServe InferenceService instead."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the YAML here, not stdout."),
    validate: bool = typer.Option(True, help="Validate against the supported Kubernetes "
                                             "versions (needs kubernetes-validate)."),
) -> None:
    """Write Kubernetes manifests (Deployment, Service, HorizontalPodAutoscaler) or a KServe
    InferenceService for a serving image; apply them with kubectl apply -f.

    Example: triton-builder deploy k8s registry:5000/embed:2 -o triton.yaml
    """
    from builder.deploy import kubernetes
    from builder.deploy.serving import deployable_image

    client = None
    if gpu is None:
        from builder.engine import EngineError, docker_client

        try:
            client = docker_client()
        except EngineError:
            client = None  # no engine here: a CPU image unless --gpu says otherwise
    image = _run("reading the image", lambda: deployable_image(reference, gpu=gpu, client=client))
    options = _run("reading the options", lambda: kubernetes.KubernetesOptions(
        name=name, namespace=namespace, replicas=replicas, min_replicas=min_replicas,
        max_replicas=max_replicas))
    documents = kubernetes.manifests(image, options)
    chosen = ({"inferenceservice": documents["inferenceservice"]} if kserve else
              {key: documents[key] for key in ("deployment", "service", "hpa")})
    if validate:
        checked = _run("validating", lambda: kubernetes.validate(chosen))
        console.print(f"validated {len(chosen)} manifest(s) against Kubernetes "
                      f"{', '.join(kubernetes.SUPPORTED_KUBERNETES)} ({len(checked)} checks)")
    text = kubernetes.to_yaml(chosen.values())
    if output is not None:
        output.write_text(text)
        print(output)
    else:
        print(text, end="")


def load_pipeline(reference: str) -> Any:
    """Import ``file.py:attr`` or ``module:attr`` and return the attribute.

    A file inside a package (``pipelines/text_embedding.py``) is imported as that package's
    module, with the package's parent on ``sys.path``, so its own imports work.
    """
    import importlib

    from builder.errors import PipelineError, TritonBuilderError
    from builder.pipeline.dsl import Pipeline

    target, _, attribute = reference.rpartition(":")
    if not target or not attribute:
        raise ValueError(f"{reference!r} is not 'file.py:attr' or 'module:attr'")
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"no such pipeline file: {target}")
        parts, root = [path.stem], path.parent
        while (root / "__init__.py").exists():
            parts.insert(0, root.name)
            root = root.parent
        sys.path.insert(0, str(root))
        target = ".".join(parts)
    try:
        module = importlib.import_module(target)
    except TritonBuilderError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's code: say where it failed
        raise PipelineError(f"importing {target} failed{_where(error)}: "
                            f"{type(error).__name__}: {error}") from error
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{target} has no attribute {attribute!r}") from None
    if not isinstance(value, Pipeline):
        raise ValueError(f"{reference} is a {type(value).__name__}, not a finished pipeline "
                         f"(end it with .output(...))")
    return value


def _where(error: BaseException) -> str:
    """`` at file:line``: the innermost frame outside Python and its packages (the user's
    line, not torch's), or a syntax error's own line."""
    import traceback

    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(("<", sys.prefix, sys.base_prefix))]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _pipeline_inputs(client) -> list[str] | None:
    """The pipeline's input columns; None for a plain model (no pipeline signature)."""
    from builder.client.codec import NotAPipelineError

    try:
        return list(client.codec.signature.inputs)
    except NotAPipelineError:
        return None


def _parse_input(item: str) -> tuple[str, Any]:
    name, sep, text = item.partition("=")
    if not sep or not name:
        raise ValueError(f"--input {item!r}: expected name=value")
    if text.startswith("@"):
        try:
            return name, Path(text[1:]).read_bytes()
        except OSError as error:
            raise ValueError(f"--input {item!r}: cannot read {text[1:]}: "
                             f"{error.strerror or error}") from None
    try:
        return name, json.loads(text)
    except json.JSONDecodeError:
        return name, text


def _jsonable(value: Any) -> Any:
    import numpy as np

    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def _image_sbom(client, reference: str) -> str:
    """The SBOM the image's ``ai.triton-builder.sbom`` label points at, read from the image."""
    from builder.engine.image_files import read_image_files
    from builder.image.labels import SBOM

    path = _image_labels(client, reference).get(SBOM)
    if not path:
        raise LookupError(f"{reference} has no {SBOM} label: it was not built by triton-builder, "
                          f"or by a version that wrote no bill of materials")
    content = read_image_files(client, reference, [path])[path]
    if content is None:
        raise LookupError(f"{reference} has no file {path}, where its {SBOM} label points")
    return content.decode()


def _platform_images(client, reference: str, labels: dict[str, str]) -> dict[str, Any]:
    """Where the engine holds each platform of a multi-platform build (one platform per tag:
    ``TAG-<architecture>``), and that a push makes them one image index under the tag."""
    import docker.errors

    from builder.engine.platforms import parse_platform, platform_references
    from builder.image.labels import PLATFORM, PLATFORMS

    names = labels[PLATFORMS].split(",")
    own = labels.get(PLATFORM)
    suffix = f"-{parse_platform(own).tag_suffix}" if own in names else None
    tag = reference[:-len(suffix)] if suffix and reference.endswith(suffix) else reference
    shown: dict[str, Any] = {}
    for name in names:
        (local,) = platform_references([tag], parse_platform(name))
        try:
            attributes = client.api.inspect_image(local)
            shown[name] = {"tag": local, "id": attributes["Id"],
                           "architecture": attributes.get("Architecture"),
                           "size": attributes.get("Size")}
        except docker.errors.ImageNotFound:
            shown[name] = {"tag": local, "id": None, "missing": "not on this engine"}
    shown["index"] = (f"at push, {tag} is one OCI image index of "
                      f"{', '.join(n for n in shown)} (each pushed as its own tag first)")
    return shown


def _image_labels(client, reference: str) -> dict[str, str]:
    import docker.errors

    try:
        return client.images.get(reference).labels or {}
    except docker.errors.ImageNotFound:
        raise LookupError(f"no image {reference!r} on this engine") from None

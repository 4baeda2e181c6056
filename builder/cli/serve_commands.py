"""``serve``, ``infer`` and ``inspect``: run an image, call what it serves, say what it is."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from builder.cli.app import EXIT_USAGE, app, console, fail, report_error, run_step
from builder.cli.command_options import parameter_default
from builder.verify.container import TRITON_PORTS, ServingContainer

HTTP_PORT, GRPC_PORT, METRICS_PORT = TRITON_PORTS


@app.command()
def serve(
    reference: str = typer.Argument(..., help="Image to run."),
    http_port: int = typer.Option(HTTP_PORT, help="Host port for HTTP."),
    grpc_port: int = typer.Option(GRPC_PORT, help="Host port for gRPC."),
    metrics_port: int = typer.Option(METRICS_PORT, help="Host port for metrics."),
    detach: bool = typer.Option(False, help="Leave it running and print the container id."),
    timeout: float = typer.Option(parameter_default(ServingContainer.start, "timeout"),
                                  help="Seconds to wait for readiness."),
) -> None:
    """Run an image, wait until Triton is ready and print its endpoints.

    Example: triton-builder serve embed:1 --detach && triton-builder infer
    grpc://127.0.0.1:8001/pipeline --input text=hello
    """
    import docker.errors

    from builder.deploy.serving import carries_weights_cache
    from builder.engine import ensure_engine
    from builder.verify.weights_source import node_cache_volumes

    client = ensure_engine()
    try:
        beside = carries_weights_cache(client.images.get(reference))
    except docker.errors.ImageNotFound:
        beside = False
    container = run_step("starting the server", lambda: ServingContainer(
        client, reference, host_ports=(http_port, grpc_port, metrics_port),
        volumes=node_cache_volumes() if beside else None))
    try:
        endpoint = container.start(timeout)
    except Exception as error:  # noqa: BLE001 - its log first, then the one error line
        console.print(container.logs()[-4000:])
        container.remove()
        report_error("starting the server", error)
    console.print(f"ready: grpc://{endpoint.grpc_url}  http://{endpoint.http_url}  "
                  f"metrics http://{endpoint.metrics_url}/metrics")
    started = container.container
    if started is None:  # start() returned: it holds the container it started
        report_error("starting the server", RuntimeError("no container was started"))
    if detach:
        console.print(f"stop it with: docker rm -f {started.short_id}")
        print(started.id)
        return
    try:
        for line in started.logs(stream=True, follow=True):
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
    stream: bool = typer.Option(False, "--stream", help="Print each item of a streaming "
                                "pipeline as it arrives, one JSON line each (gRPC)."),
) -> None:
    """Call a served model or pipeline once and print its outputs as JSON.

    Example: triton-builder infer grpc://127.0.0.1:8001/pipeline -i text="hello world"
    """
    from builder.client.pipeline import Client

    values = run_step("reading the inputs", lambda: dict(_parse_input(item) for item in input))
    with run_step("reading the URL", lambda: Client(url)) as client:
        columns = run_step("reading the model", lambda: _pipeline_inputs(client))
        if columns is None:
            result = run_step("inference", lambda: client.model(**values))
        else:
            missing = [c for c in columns if c not in values]
            if missing or set(values) - set(columns):
                fail("reading the inputs", f"the pipeline takes inputs {columns}; got "
                      f"{sorted(values)}: give each with -i name=value", EXIT_USAGE)
            values = _as_arrays(values, client.codec.signature.inputs)
            if stream:
                items = run_step("starting the stream",
                                 lambda: client.stream(*(values[c] for c in columns)))
                run_step("streaming", lambda: _print_each(items))
                return
            result = run_step("inference", lambda: client(*(values[c] for c in columns)))
    if stream:
        fail("reading the model", f"{url} is not a pipeline: --stream reads a streaming "
             "pipeline's items", EXIT_USAGE)
    print(json.dumps(_jsonable(result), ensure_ascii=False))


def _print_each(items: Any) -> None:
    """Each item as one JSON line, flushed as it comes (a reader sees it at once)."""
    for item in items:
        print(json.dumps(_jsonable(item), ensure_ascii=False), flush=True)


@app.command()
def inspect(
    reference: str = typer.Argument(..., help="Image to describe."),
    sbom: bool = typer.Option(False, "--sbom", help="Print the image's bill of materials "
                              "(CycloneDX JSON) instead of its labels."),
    inputs: bool = typer.Option(False, "--inputs", help="Print what the image was made from "
                                "(the same inputs give the same image ID)."),
    layers: bool = typer.Option(False, "--layers", help="Print each layer, oldest first: what "
                                "it holds (base, environment, weights of a model, runtime, "
                                "code) and its size unpacked."),
) -> None:
    """Show what an image serves: signature, Triton, CUDA, environment (from its labels).

    Example: triton-builder inspect embed:1; triton-builder inspect embed:1 --layers
    """
    from builder.engine import ensure_engine
    from builder.image.labels import PLATFORMS, image_inputs

    if layers:
        print(json.dumps(run_step("reading the layers",
                                  lambda: _image_layers(ensure_engine(), reference)), indent=2))
        return
    if sbom:
        print(run_step("reading the bill of materials",
                   lambda: _image_sbom(ensure_engine(), reference)), end="")
        return
    labels = run_step("reading the image", lambda: _image_labels(ensure_engine(), reference))
    if inputs:
        print(json.dumps(image_inputs(labels), indent=2, sort_keys=True))
        return
    ours: dict[str, Any] = {key: value for key, value in labels.items()
            if key.startswith(("ai.triton-builder.", "org.opencontainers.image."))}
    for key, value in ours.items():
        if key.endswith(".signature"):
            ours[key] = json.loads(value)
    if PLATFORMS in labels:
        ours["platforms"] = run_step("reading the platforms' images",
                                 lambda: _platform_images(ensure_engine(), reference, labels))
    print(json.dumps(ours, indent=2, sort_keys=True))


def _pipeline_inputs(client) -> list[str] | None:
    """The pipeline's input columns; None for a plain model (no pipeline signature)."""
    from builder.client.codec import NotAPipelineError

    try:
        return list(client.codec.signature.inputs)
    except NotAPipelineError:
        return None


def _as_arrays(values: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
    """JSON lists for the pipeline's array inputs as NumPy arrays of their type (an image
    given as nested lists of numbers)."""
    import numpy as np

    from builder.pipeline.signature import numpy_dtype

    return {name: np.asarray(value, dtype=numpy_dtype(specs[name].dtype))
            if isinstance(value, list) and specs[name].pytype == "numpy" else value
            for name, value in values.items()}


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


def _image_layers(client, reference: str) -> dict[str, Any]:
    """The image's layers (part and size, oldest first) and their total."""
    import docker.errors

    from builder.engine.image_config import image_layers

    try:
        layers = image_layers(client, reference)
    except docker.errors.ImageNotFound:
        raise LookupError(f"no image {reference!r} on this engine") from None
    return {"layers": [{"part": layer.part, "size": layer.size} for layer in layers],
            "size": sum(layer.size for layer in layers)}


def _image_labels(client, reference: str) -> dict[str, str]:
    import docker.errors

    try:
        return client.images.get(reference).labels or {}
    except docker.errors.ImageNotFound:
        raise LookupError(f"no image {reference!r} on this engine") from None

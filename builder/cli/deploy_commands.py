"""``deploy swarm`` and ``deploy k8s``: a serving image as a Swarm stack or Kubernetes
manifests."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer
from rich.text import Text

from builder.cli.app import EXIT_USAGE, console, deploy_app, fail, run_step
from builder.cli.command_options import field_default, field_option, parameter_default
from builder.deploy.kubernetes import KubernetesOptions
from builder.deploy.swarm import STACK, PublishMode, SwarmOptions, deploy_swarm

HTTP_PORT, GRPC_PORT, METRICS_PORT = field_default(SwarmOptions, "ports")


@deploy_app.command("swarm")
def deploy_swarm_command(
    reference: str = typer.Argument(..., help="Serving image (built by triton-builder)."),
    replicas: int = field_option(SwarmOptions, "replicas"),
    name: str = typer.Option(STACK, help="Stack name."),
    shm_size: str = field_option(SwarmOptions, "shm_size"),
    publish: str = field_option(SwarmOptions, "publish"),
    http_port: int = typer.Option(HTTP_PORT, help="Published HTTP port (0: random, host mode)."),
    grpc_port: int = typer.Option(GRPC_PORT, help="Published gRPC port (0: random, host mode)."),
    metrics_port: int = typer.Option(METRICS_PORT,
                                     help="Published metrics port (0: random, host mode)."),
    health_interval: int = field_option(SwarmOptions, "health_interval_s"),
    health_retries: int = field_option(SwarmOptions, "health_retries"),
    update_delay: int = field_option(SwarmOptions, "update_delay_s"),
    stack_file: Path = typer.Option(None, help="Keep the stack (compose) file here."),
    dry_run: bool = typer.Option(False, help="Print the stack file; deploy nothing."),
    wait: float = typer.Option(parameter_default(deploy_swarm, "wait"),
                               help="Seconds to wait for every replica to be healthy "
                                    "(0: do not wait)."),
) -> None:
    """Deploy (or update, rolling and start-first) a serving image as a Docker Swarm stack.

    Example: triton-builder deploy swarm registry:5000/embed:2 --replicas 3
    """
    from builder.deploy.serving import deployable_image
    from builder.deploy.swarm import stack_document, write_stack
    from builder.engine import ensure_engine

    ports = (http_port or None, grpc_port or None, metrics_port or None)
    options = run_step("reading the options", lambda: SwarmOptions(
        replicas=replicas, shm_size=shm_size,
        publish=cast(PublishMode, publish),  # any text: SwarmOptions refuses another mode
        ports=ports,
        health_interval_s=health_interval, health_retries=health_retries,
        update_delay_s=update_delay))
    if dry_run:
        from builder.engine import EngineError, docker_client

        try:
            engine = docker_client()
        except EngineError:
            engine = None  # no engine here: described without its labels (a CPU image)
        image = run_step("reading the image", lambda: deployable_image(reference, client=engine))
        document = stack_document(image, options)
        if stack_file is not None:
            write_stack(document, stack_file)
        import yaml

        print(yaml.safe_dump(document, sort_keys=False), end="")
        return
    client = run_step("reaching the engine", ensure_engine)
    image = run_step("reading the image", lambda: deployable_image(reference, client=client))
    with console.status(Text(f"deploying {reference} as stack {name}")):
        run_step("deploying", lambda: deploy_swarm(image, name, options, client=client,
                                               stack_file=stack_file, wait=wait or None))
    console.print(f"stack {name}: {replicas} replica(s) of {reference}"
                  + (" healthy" if wait else " deploying"))
    print(name)


@deploy_app.command("k8s")
def deploy_k8s_command(
    reference: str = typer.Argument(..., help="Serving image (as the cluster pulls it)."),
    name: str = field_option(KubernetesOptions, "name"),
    namespace: str = field_option(KubernetesOptions, "namespace"),
    replicas: int = field_option(KubernetesOptions, "replicas"),
    min_replicas: int = field_option(KubernetesOptions, "min_replicas"),
    max_replicas: int = field_option(KubernetesOptions, "max_replicas"),
    weights_host_path: str = field_option(KubernetesOptions, "weights_host_path"),
    scale_on: str = field_option(KubernetesOptions, "scale_on"),
    queue_target_ms: float = field_option(KubernetesOptions, "queue_target_ms"),
    pending_target: float = field_option(KubernetesOptions, "pending_target"),
    gpu: bool = typer.Option(None, "--gpu/--cpu", help="Ask for GPUs [default: from the "
                                                       "image's labels where it is local]"),
    kserve: bool = typer.Option(False, help="Write a KServe InferenceService instead."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the YAML here, not stdout."),
    validate: bool = typer.Option(True, help="Validate against the supported Kubernetes "
                                             "versions (needs kubernetes-validate)."),
) -> None:
    """Write Kubernetes manifests (Deployment, Service, HorizontalPodAutoscaler, and with
    --scale-on queue or pending prometheus-adapter's rule as a ConfigMap) or a KServe
    InferenceService for a serving image; apply them with kubectl apply -f.

    Example: triton-builder deploy k8s registry:5000/embed:2 -o triton.yaml
    """
    from builder.deploy import kubernetes
    from builder.deploy.serving import deployable_image
    from builder.engine import EngineError, docker_client

    try:  # the image's labels and volumes, where it is local
        client = docker_client()
    except EngineError:
        client = None  # no engine here: a CPU image unless --gpu says otherwise
    image = run_step("reading the image",
                     lambda: deployable_image(reference, gpu=gpu, client=client))
    options = run_step("reading the options", lambda: kubernetes.KubernetesOptions(
        name=name, namespace=namespace, replicas=replicas, min_replicas=min_replicas,
        max_replicas=max_replicas, weights_host_path=weights_host_path, scale_on=scale_on,
        queue_target_ms=queue_target_ms, pending_target=pending_target))
    if kserve and options.scale_on != "cpu":
        fail("reading the options", f"--scale-on {options.scale_on} writes a "
             "HorizontalPodAutoscaler: a KServe InferenceService scales by its own scaleMetric "
             "(leave --scale-on cpu)", EXIT_USAGE)
    documents = kubernetes.manifests(image, options)
    kinds = ("inferenceservice",) if kserve else ("deployment", "service", "hpa",
                                                  "adapter-rules")
    chosen = {key: documents[key] for key in kinds if key in documents}
    if validate:
        checked = run_step("validating", lambda: kubernetes.validate(chosen))
        console.print(f"validated {len(chosen)} manifest(s) against Kubernetes "
                      f"{', '.join(kubernetes.SUPPORTED_KUBERNETES)} ({len(checked)} checks)")
    text = kubernetes.to_yaml(chosen.values())
    if output is not None:
        output.write_text(text)
        print(output)
    else:
        print(text, end="")

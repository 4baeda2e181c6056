"""Kubernetes and KServe: manifests for a serving image, checked against the API schemas.

:func:`manifests` writes what a cluster needs to run the image and keep it honest:

* a ``Deployment`` whose pods mount ``/dev/shm`` as a memory ``emptyDir`` (the python backend's
  shared memory), ask for ``nvidia.com/gpu`` when the image is a CUDA one, and carry three probes: a
  ``startupProbe`` on Triton's ``/v2/health/ready``, a ``readinessProbe`` on the supervisor's
  (traffic only to pods whose models are loaded and that are not stopping), and a ``livenessProbe``
  that runs the image's health check (:mod:`builder.runtime.health` with ``--live``: the server
  answers and no python backend stub has died — Triton itself keeps saying ready with a dead stub,
  so without it a broken pod would never be restarted). A ``preStop`` hook starts the container's
  drain and waits for it (:mod:`builder.runtime.drain`: not ready at once, serving on while the
  Service's endpoints drop the pod, then the requests in flight answered); the grace period covers
  the drain and the requests in flight. The pod template is annotated for Prometheus on the metrics
  port. Pods run locked down, as the Pod Security Standards' "restricted" profile asks: not as root
  (the image's own unprivileged user), no privilege escalation, every capability dropped, the
  ``RuntimeDefault`` seccomp profile, a read-only root file system with ``/tmp`` a writable
  ``emptyDir`` (the health check's file of healed stubs; an environment archive's extraction on
  releases before 23.07);
* a ``Service`` with the http, grpc and metrics ports;
* a ``HorizontalPodAutoscaler`` (``autoscaling/v2``) on CPU utilisation;
* and, as an alternative to those three, a KServe ``InferenceService`` (``serving.kserve.io/
  v1beta1``) with the same container, probes and shared memory as a custom predictor.

:func:`validate` checks the Kubernetes objects with ``kubernetes-validate`` (the API's JSON
schemas, bundled, offline) for every version in :data:`SUPPORTED_KUBERNETES`. No schema of
KServe's CRD is bundled: of an ``InferenceService`` the predictor's pod spec is validated as a
Kubernetes ``PodSpec`` (what KServe embeds), its other fields are checked here by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from builder.deploy.metrics_queries import pending_requests, queue_ms_per_request
from builder.deploy.serving import (
    METRICS_PATH,
    READY_PATH,
    DeployableImage,
    DeployError,
    size_bytes,
)
from builder.runtime.supervisor.weights_lock import CACHE_DIR

SUPPORTED_KUBERNETES = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
"""Kubernetes versions the manifests are validated against (kubernetes-validate's schemas)."""
KSERVE_API = "serving.kserve.io/v1beta1"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


SCALE_METRICS = {"queue": "triton_queue_ms_per_request", "pending": "triton_pending_requests"}
"""The custom metric each ``scale_on`` gives the autoscaler, by prometheus-adapter's rules."""


@dataclass(frozen=True)
class KubernetesOptions:
    """The workload's knobs; defaults suit one model server per pod."""

    name: str = field(default="triton", metadata={
        "help": "Name of the Deployment, Service, HPA."})
    namespace: str | None = field(default=None, metadata={"help": "Namespace of the objects."})
    replicas: int = field(default=2, metadata={"help": "Replicas to start with."})
    min_replicas: int = field(default=2, metadata={"help": "Autoscaler minimum."})
    max_replicas: int = field(default=8, metadata={"help": "Autoscaler maximum."})
    target_cpu_percent: int = 70
    cpu_request: str = "2"
    memory_request: str = "4Gi"
    memory_limit: str | None = None
    gpus: int = 1
    """``nvidia.com/gpu`` per pod, for CUDA images."""
    shm_size: str = "1Gi"
    startup_seconds: int = 600
    """How long a pod may take to load its models (and fetch weights that travel beside the
    image) before Kubernetes gives up on it."""
    scale_on: str = field(default="cpu", metadata={"help": (
        "What the autoscaler scales on beside CPU: 'cpu' (CPU alone), 'queue' (the "
        "milliseconds a request waits in Triton's queue) or 'pending' (requests waiting per "
        "pod), the last two as Pods metrics through prometheus-adapter (its rules are "
        "written too).")})
    queue_target_ms: float = field(default=20.0, metadata={"help": (
        "With scale_on 'queue': the average queue time per request (ms) to hold.")})
    pending_target: float = field(default=4.0, metadata={"help": (
        "With scale_on 'pending': the requests waiting per pod to hold.")})
    weights_host_path: str | None = field(default=None, metadata={"help": (
        "For an image whose weights travel beside it: a directory of each node (writable by "
        "the image's user) that caches them, so each digest is fetched once per node; "
        "default: an emptyDir, fetched once per pod.")})

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or len(self.name) > 53:
            raise DeployError(f"name must be a DNS label (lowercase, digits, '-'; at most 53 "
                              f"characters): {self.name!r}")
        if self.namespace is not None and not _NAME.fullmatch(self.namespace):
            raise DeployError(f"namespace must be a DNS label: {self.namespace!r}")
        if not 1 <= self.min_replicas <= self.max_replicas or self.replicas < 1:
            raise DeployError(f"replicas must satisfy 1 <= min_replicas ({self.min_replicas}) "
                              f"<= max_replicas ({self.max_replicas}), replicas >= 1")
        size_bytes(self.shm_size.replace("i", ""))
        if self.scale_on not in SCALE_METRICS and self.scale_on != "cpu":
            raise DeployError(f"scale_on must be one of cpu, {', '.join(SCALE_METRICS)}: "
                              f"{self.scale_on!r}")
        if self.queue_target_ms <= 0 or self.pending_target <= 0:
            raise DeployError("queue_target_ms and pending_target must be positive")
        if self.weights_host_path is not None and not self.weights_host_path.startswith("/"):
            raise DeployError(f"weights_host_path must be an absolute path of the nodes: "
                              f"{self.weights_host_path!r}")


def manifests(image: DeployableImage, options: KubernetesOptions = KubernetesOptions(),
              ) -> dict[str, dict[str, Any]]:
    """``{"deployment", "service", "hpa", "inferenceservice"}`` → the manifest, as data."""
    labels = {"app.kubernetes.io/name": options.name,
              "app.kubernetes.io/component": "triton-inference-server",
              "app.kubernetes.io/managed-by": "triton-builder"}
    container = _container(image, options)
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}},
               {"name": "tmp", "emptyDir": {}}]
    if image.weights_beside:
        volumes.append({"name": "weights", **(
            {"hostPath": {"path": options.weights_host_path, "type": "Directory"}}
            if options.weights_host_path else {"emptyDir": {}})})
    pod_security = _pod_security(image)
    prometheus = {"prometheus.io/scrape": "true", "prometheus.io/port": str(image.metrics_port),
                  "prometheus.io/path": METRICS_PATH}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(options, labels),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": options.name}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels, "annotations": prometheus},
                "spec": {"securityContext": pod_security, **_weights_fetch(image, container),
                         "containers": [container], "volumes": volumes,
                         "terminationGracePeriodSeconds": image.stop_seconds},
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(options, labels),
        "spec": {"selector": {"app.kubernetes.io/name": options.name}, "ports": [
            {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
            for name, port in _ports(image)]},
    }
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(options, labels),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": options.name},
            "minReplicas": options.min_replicas, "maxReplicas": options.max_replicas,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": options.target_cpu_percent}}},
                        *_queue_metric(options)],
        },
    }
    predictor_container = dict(container, name="kserve-container")
    # KServe routes one port per predictor: HTTP (KServe v2 protocol, which Triton speaks).
    predictor_container["ports"] = [{"name": "http1",
                                     "containerPort": image.http_port, "protocol": "TCP"}]
    inference_service = {
        "apiVersion": KSERVE_API, "kind": "InferenceService",
        "metadata": dict(_metadata(options, labels),
                         annotations={"serving.kserve.io/enable-prometheus-scraping": "true",
                                      **prometheus}),
        "spec": {"predictor": {
            "minReplicas": options.min_replicas, "maxReplicas": options.max_replicas,
            "scaleMetric": "cpu", "scaleTarget": options.target_cpu_percent,
            "securityContext": pod_security, **_weights_fetch(image, container),
            "containers": [predictor_container],
            "volumes": volumes, "terminationGracePeriodSeconds": image.stop_seconds,
        }},
    }
    documents = {"deployment": deployment, "service": service, "hpa": hpa,
                 "inferenceservice": inference_service}
    if options.scale_on in SCALE_METRICS:
        documents["adapter-rules"] = adapter_rules(image, options, labels)
    return documents


def _queue_metric(options: KubernetesOptions) -> list[dict[str, Any]]:
    """The autoscaler's Pods metric beside CPU (it follows whichever asks for more pods)."""
    if options.scale_on not in SCALE_METRICS:
        return []
    target = (options.queue_target_ms if options.scale_on == "queue"
              else options.pending_target)
    return [{"type": "Pods", "pods": {
        "metric": {"name": SCALE_METRICS[options.scale_on]},
        "target": {"type": "AverageValue", "averageValue": f"{round(target * 1000)}m"}}}]


def adapter_rules(image: DeployableImage, options: KubernetesOptions,
                  labels: dict[str, str]) -> dict[str, Any]:
    """A ConfigMap with prometheus-adapter's rule for the chosen metric (its ``config.yaml``:
    give it to the adapter's ``--config``, or merge the rule into the adapter's own), read at
    the image's pipeline model: what a request waits before the pipeline runs it (a slow model
    operator keeps the pipeline model's instances waiting, so its queue grows too). The series
    carry ``namespace`` and ``pod`` labels as the usual ``kubernetes-pods`` scrape job (the
    pods' ``prometheus.io`` annotations) relabels them."""
    pod = f'{{<<.LabelMatchers>>,model="{image.pipeline_model}"}}'
    by = "<<.GroupBy>>"
    series, query = (
        ("nv_inference_queue_duration_us", queue_ms_per_request(pod, by, "2m"))
        if options.scale_on == "queue" else
        ("nv_inference_pending_request_count", pending_requests(pod, by)))
    rule = {"seriesQuery": f'{series}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"},
                                        "pod": {"resource": "pod"}}},
            "name": {"matches": f"^{series}$", "as": SCALE_METRICS[options.scale_on]},
            "metricsQuery": query}
    metadata = _metadata(options, labels)
    metadata["name"] = f"{options.name}-adapter-rules"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {"config.yaml": yaml.safe_dump({"rules": [rule]}, sort_keys=False)}}


def _ports(image: DeployableImage) -> list[tuple[str, int]]:
    return [("http", image.http_port), ("grpc", image.grpc_port),
            ("metrics", image.metrics_port)]


def _container(image: DeployableImage, options: KubernetesOptions) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": options.cpu_request, "memory": options.memory_request}
    limits: dict[str, Any] = {}
    if options.memory_limit:
        limits["memory"] = options.memory_limit
    if image.gpu:
        limits["nvidia.com/gpu"] = options.gpus
        requests["nvidia.com/gpu"] = options.gpus
    period = 10
    return {
        "name": "triton",
        "image": image.reference,
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"}
                  for name, port in [*_ports(image), ("supervisor", image.supervisor_port)]],
        "startupProbe": {"httpGet": {"path": READY_PATH, "port": "http"},
                         "periodSeconds": period,
                         "failureThreshold": max(1, options.startup_seconds // period)},
        "readinessProbe": {"httpGet": {"path": READY_PATH, "port": "supervisor"},
                           "periodSeconds": 5, "timeoutSeconds": 4, "failureThreshold": 2},
        "lifecycle": {"preStop": {"exec": {"command": image.drain_command}}},
        "livenessProbe": {"exec": {"command": image.liveness_command},
                          "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "tmp", "mountPath": "/tmp"},
                         *([{"name": "weights", "mountPath": CACHE_DIR}]
                           if image.weights_beside else [])],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }


def _weights_fetch(image: DeployableImage, container: dict[str, Any]) -> dict[str, Any]:
    """An init container that fills the weights cache for an image whose weights travel
    beside it: the pod shows ``Init`` while the files arrive, a refused or unreachable digest
    is the init container's error (exit 78, retried with the kubelet's back-off), and the
    server's container starts only once every file is in place and checked."""
    if not image.weights_beside:
        return {}
    return {"initContainers": [{
        "name": "weights", "image": image.reference, "command": image.fetch_weights_command,
        "resources": container["resources"],
        "volumeMounts": [mount for mount in container["volumeMounts"]
                         if mount["name"] in ("tmp", "weights")],
        "securityContext": container["securityContext"],
    }]}


def _pod_security(image: DeployableImage) -> dict[str, Any]:
    """Not root, and the runtime's default seccomp profile. The image's numeric user is stated
    as well: Kubernetes verifies ``runAsNonRoot`` only for a numeric ``USER``."""
    security: dict[str, Any] = {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}}
    ids = image.uid_gid
    if ids is not None:
        security["runAsUser"] = ids[0]
        if ids[1] is not None:
            security["runAsGroup"] = ids[1]
    return security


def _metadata(options: KubernetesOptions, labels: dict[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": options.name, "labels": dict(labels)}
    if options.namespace:
        metadata["namespace"] = options.namespace
    return metadata


def to_yaml(documents: Iterable[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(list(documents), sort_keys=False)


class ManifestInvalidError(DeployError):
    """A manifest does not validate against a supported Kubernetes version's schema."""


def validate(documents: dict[str, dict[str, Any]],
             versions: Iterable[str] = SUPPORTED_KUBERNETES) -> list[str]:
    """Validate every manifest for every version; return what was checked, one line each.

    Needs ``kubernetes-validate`` (``pip install kubernetes-validate``)."""
    try:
        import kubernetes_validate
    except ImportError as error:
        raise DeployError("validating manifests needs kubernetes-validate "
                          "(pip install kubernetes-validate)") from error
    checked = []
    for version in versions:
        for key, document in documents.items():
            targets = [document]
            if document.get("apiVersion") == KSERVE_API:
                _check_inference_service(document)
                predictor = document["spec"]["predictor"]
                targets = [{"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": document["metadata"]["name"]},
                            "spec": {"containers": predictor["containers"],
                                     "initContainers": predictor.get("initContainers", []),
                                     "volumes": predictor.get("volumes", []),
                                     "terminationGracePeriodSeconds": predictor.get(
                                         "terminationGracePeriodSeconds", 30),
                                     "securityContext": predictor.get("securityContext", {})}}]
            for target in targets:
                try:
                    kubernetes_validate.validate(target, version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    where = ".".join(str(p) for p in error.path)
                    raise ManifestInvalidError(
                        f"{key} ({document['kind']}) is not valid for Kubernetes {version}: "
                        f"{where}: {error.message}") from None
            checked.append(f"{key} ({document['kind']}) valid for Kubernetes {version}"
                           + (" (predictor pod spec)" if key == "inferenceservice" else ""))
    return checked


_PREDICTOR_FIELDS = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "containers",
                     "initContainers", "volumes", "securityContext",
                     "terminationGracePeriodSeconds", "serviceAccountName", "nodeSelector",
                     "tolerations"}


def _check_inference_service(document: dict[str, Any]) -> None:
    """The fields of an InferenceService that no bundled schema covers, by KServe's v1beta1
    API: a predictor with exactly one container, known scaling fields."""
    predictor = document.get("spec", {}).get("predictor")
    if not isinstance(predictor, dict):
        raise ManifestInvalidError("InferenceService: spec.predictor is missing")
    unknown = set(predictor) - _PREDICTOR_FIELDS
    if unknown:
        raise ManifestInvalidError(f"InferenceService: unknown predictor fields {sorted(unknown)}")
    if len(predictor.get("containers", [])) != 1:
        raise ManifestInvalidError("InferenceService: a custom predictor has one container")
    if predictor.get("scaleMetric") not in (None, "cpu", "memory", "concurrency", "rps"):
        raise ManifestInvalidError(f"InferenceService: scaleMetric {predictor['scaleMetric']!r}")

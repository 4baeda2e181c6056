"""Deployment descriptions: the Swarm stack file and the Kubernetes / KServe manifests.

Fast tests check them against the tools that read them — ``docker stack config`` (the Docker
CLI's own compose schema, offline) and ``kubernetes-validate`` (the API's JSON schemas of every
supported version, strict: unknown fields fail) — and that a broken one is refused. No cluster
runs here: the slow test runs the real image and checks that the probes and the Prometheus
annotation reach Triton's real endpoints, and that the liveness command sees a dead stub.
The Swarm stacks run for real in ``tests/e2e/test_swarm.py``.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import urllib.request

import pytest
import yaml

from builder.deploy import kubernetes
from builder.deploy.serving import DeployableImage, DeployError, deployable_image, size_bytes
from builder.deploy.swarm import SwarmOptions, stack_document, write_stack

CPU = DeployableImage("registry.example:5000/embed:2", gpu=False)
GPU = DeployableImage("registry.example:5000/embed-cuda:2", gpu=True)


# -- Swarm ------------------------------------------------------------------------------------
def test_the_stack_heals_updates_start_first_and_mounts_shared_memory():
    service = stack_document(CPU, SwarmOptions(replicas=3))["services"]["triton"]
    deploy = service["deploy"]
    assert deploy["replicas"] == 3
    assert deploy["update_config"]["order"] == "start-first"
    assert deploy["update_config"]["delay"] == "5s"
    assert deploy["rollback_config"]["order"] == "start-first"
    assert deploy["restart_policy"]["condition"] == "any"
    assert service["healthcheck"]["test"] == ["CMD", "python3", "/opt/triton-builder/health.py",
                                              "--http-port=8000"]
    assert service["volumes"] == [{"type": "tmpfs", "target": "/dev/shm",
                                   "tmpfs": {"size": 1024**3}},
                                  {"type": "tmpfs", "target": "/tmp"}]
    assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert [(p["target"], p["published"], p["mode"]) for p in service["ports"]] == [
        (8000, 8000, "ingress"), (8001, 8001, "ingress"), (8002, 8002, "ingress")]
    assert "resources" not in deploy
    gpu = stack_document(GPU, SwarmOptions())["services"]["triton"]["deploy"]
    assert gpu["resources"]["reservations"]["generic_resources"] == [
        {"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 1}}]


def test_an_image_that_extracts_an_archive_at_start_keeps_its_longer_start_period():
    """A 22.12 image carrying its environment as an archive (builder.image.startup) declares a
    longer start period than the stack's default; the stack must not cut it short."""
    assert stack_document(GPU)["services"]["triton"]["healthcheck"]["start_period"] == "120s"
    slow = DeployableImage("registry.example:5000/embed-cuda:2", gpu=True, start_period_s=300)
    assert stack_document(slow)["services"]["triton"]["healthcheck"]["start_period"] == "300s"


def test_host_mode_publishes_random_ports_per_replica():
    service = stack_document(CPU, SwarmOptions(replicas=3, publish="host",
                                               ports=(None, None, None)))["services"]["triton"]
    assert all(p["mode"] == "host" and "published" not in p for p in service["ports"])


@pytest.mark.parametrize("options, message", [
    (dict(replicas=0), "replicas must be a positive integer"),
    (dict(publish="mesh"), "publish must be 'ingress' or 'host'"),
    (dict(publish="host", replicas=2), "one replica per node"),
    (dict(ports=(None, 8001, 8002)), "needs a published port"),
    (dict(shm_size="lots"), "not a size"),
    (dict(update_delay_s=-1), "update delay must be a whole number of seconds"),
    (dict(update_delay_s=0.5), "update delay must be a whole number of seconds"),
])
def test_bad_swarm_options_are_refused(options, message):
    with pytest.raises(DeployError, match=message):
        SwarmOptions(**options)


def _stack_config_cli() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "stack", "config", "--help"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _stack_config_cli(),
                    reason="this docker CLI has no `stack config` (Debian's 20.10 lacks it; the "
                           "real deploys in test_swarm.py still validate the file)")
def test_docker_stack_config_accepts_the_stack_and_refuses_a_broken_one(tmp_path):
    """The Docker CLI's compose schema; no engine needed."""
    import os

    document = stack_document(GPU, SwarmOptions(replicas=3))
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    good = subprocess.run(["docker", "stack", "config", "-c",
                           str(write_stack(document, tmp_path / "good.yml"))],
                          capture_output=True, text=True, env=env)
    assert good.returncode == 0, good.stderr
    assert yaml.safe_load(good.stdout)["services"]["triton"]["deploy"]["replicas"] == 3
    broken = copy.deepcopy(document)
    broken["services"]["triton"]["deploy"]["update_config"]["orderr"] = "start-first"
    bad = subprocess.run(["docker", "stack", "config", "-c",
                          str(write_stack(broken, tmp_path / "bad.yml"))],
                         capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "orderr" in bad.stderr


def test_sizes_read_like_docker_run():
    assert size_bytes("1g") == 1024**3 and size_bytes("512m") == 512 * 1024**2
    assert size_bytes("2Gi") == 2 * 1024**3


# -- Kubernetes -------------------------------------------------------------------------------
@pytest.mark.parametrize("image", [CPU, GPU], ids=["cpu", "gpu"])
def test_manifests_validate_for_every_supported_kubernetes(image):
    checked = kubernetes.validate(kubernetes.manifests(image))
    assert len(checked) == 4 * len(kubernetes.SUPPORTED_KUBERNETES)


@pytest.mark.parametrize("path, value, message", [
    (("deployment", "spec", "replicas"), "two", "'two' is not of type 'integer'"),
    (("deployment", "spec", "template", "spec", "containers", 0, "livenesProbe"), {},
     "Additional properties are not allowed"),
    (("hpa", "spec", "maxReplicas"), None, "None is not of type 'integer'"),
    (("inferenceservice", "spec", "predictor", "containers", 0, "ports", 0, "containerPort"),
     "8000", "'8000' is not of type 'integer'"),
])
def test_a_broken_manifest_is_refused(path, value, message):
    documents = kubernetes.manifests(CPU)
    target = documents
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(kubernetes.ManifestInvalidError, match=message):
        kubernetes.validate(documents, versions=["1.33"])


def test_gpu_images_ask_for_gpus_and_every_pod_gets_memory_backed_shm():
    for image, gpus in ((CPU, None), (GPU, 1)):
        documents = kubernetes.manifests(image)
        pod = documents["deployment"]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["resources"].get("limits", {}).get("nvidia.com/gpu") == gpus
        assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                "sizeLimit": "1Gi"}},
                                  {"name": "tmp", "emptyDir": {}}]
        assert container["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"},
                                             {"name": "tmp", "mountPath": "/tmp"}]
        predictor = documents["inferenceservice"]["spec"]["predictor"]
        assert predictor["volumes"] == pod["volumes"]
        assert predictor["containers"][0]["resources"] == container["resources"]


def test_pods_run_as_the_images_user_locked_down():
    """The Pod Security Standards' "restricted" profile: not root (the image's numeric user, so
    that the kubelet can verify it), no privilege escalation, no capability, RuntimeDefault
    seccomp, a read-only root file system; the InferenceService's predictor alike."""
    documents = kubernetes.manifests(CPU)
    pod = documents["deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                      "runAsGroup": 1000,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}}
    predictor = documents["inferenceservice"]["spec"]["predictor"]
    assert predictor["securityContext"] == pod["securityContext"]
    assert predictor["containers"][0]["securityContext"] == pod["containers"][0][
        "securityContext"]
    named = kubernetes.manifests(DeployableImage("r:5000/e:2", gpu=False, user="triton"))
    assert "runAsUser" not in named["deployment"]["spec"]["template"]["spec"]["securityContext"]


@pytest.mark.parametrize("user", ["root", "0", "0:0", ""])
def test_an_image_that_runs_as_root_is_not_deployed(user):
    with pytest.raises(DeployError, match="runs as root: the manifests run it as a non-root"):
        DeployableImage("registry.example:5000/embed:1", gpu=False, user=user)


def test_probes_and_ports_name_tritons_endpoints():
    documents = kubernetes.manifests(CPU)
    pod = documents["deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "supervisor": 8003}
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready",
                                                      "port": "supervisor"}
    assert container["livenessProbe"]["exec"]["command"] == [
        "python3", "/opt/triton-builder/health.py", "--http-port=8000", "--live"]
    annotations = pod["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/path"]) == (
        "8002", "/metrics")
    service_ports = documents["service"]["spec"]["ports"]
    assert {p["targetPort"] for p in service_ports} == set(ports) - {"supervisor"}
    assert documents["hpa"]["spec"]["scaleTargetRef"]["name"] == (
        documents["deployment"]["metadata"]["name"])


def test_a_stopping_pod_drains_within_its_grace_period():
    """The preStop hook starts the container's drain and waits for it; readiness asks the
    supervisor, which fails at once when the drain starts; the grace period covers the drain
    (the image's own, here 12 s) and the requests in flight."""
    from builder.runtime.supervisor import FINISH_S

    image = DeployableImage("registry.example:5000/embed:2", gpu=False, drain_s=12)
    documents = kubernetes.manifests(image)
    pod = documents["deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "python3", "/opt/triton-builder/supervisor.py", "--drain"]
    assert pod["terminationGracePeriodSeconds"] >= 12 + FINISH_S
    predictor = documents["inferenceservice"]["spec"]["predictor"]
    assert predictor["terminationGracePeriodSeconds"] == pod["terminationGracePeriodSeconds"]
    assert predictor["containers"][0]["lifecycle"] == container["lifecycle"]
    kubernetes.validate(documents, versions=["1.29", "1.37"])


def test_a_swarm_grace_period_shorter_than_the_drain_is_refused():
    from builder.runtime.supervisor import FINISH_S

    image = DeployableImage("registry.example:5000/embed:2", gpu=False, drain_s=10)
    grace = stack_document(image)["services"]["triton"]["stop_grace_period"]
    assert int(grace.removesuffix("s")) >= 10 + FINISH_S
    with pytest.raises(DeployError, match="shorter than the stop of .* drains for 10s"):
        stack_document(image, SwarmOptions(stop_grace_period_s=15))


def test_kubernetes_names_are_dns_labels():
    with pytest.raises(DeployError, match="DNS label"):
        kubernetes.KubernetesOptions(name="Triton_Server")


# -- against the real image -------------------------------------------------------------------
@pytest.mark.slow
def test_probes_reach_the_real_endpoints_and_liveness_sees_a_dead_stub(docker_client,
                                                                        text_embedding_image):
    """Run the image as the pod would; ask what each probe asks, where it asks. Healing is off
    (``TRITON_BUILDER_HEAL=off``) so that the killed stub stays dead while liveness looks: a
    replica that cannot heal (tests/e2e/test_reliability.py heals one that can)."""
    from builder.verify.container import ServingContainer
    from tests.e2e.test_reliability import KILL_PIPELINE_STUB

    image = deployable_image(text_embedding_image, client=docker_client)
    assert not image.gpu
    container_spec = kubernetes.manifests(image)["deployment"]["spec"]["template"]
    probes = container_spec["spec"]["containers"][0]
    annotations = container_spec["metadata"]["annotations"]
    with ServingContainer(docker_client, text_embedding_image,
                          environment={"TRITON_BUILDER_HEAL": "off"}) as endpoint:
        by_port = {8000: endpoint.http_url, 8002: endpoint.metrics_url}
        ready = probes["readinessProbe"]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://{by_port[8000]}{ready}") as response:
            assert response.status == 200
        metrics = f"http://{by_port[int(annotations['prometheus.io/port'])]}" \
                  f"{annotations['prometheus.io/path']}"
        with urllib.request.urlopen(metrics) as response:
            assert b"nv_inference_request_success" in response.read()
        container = docker_client.containers.get(endpoint.container_id)
        liveness = probes["livenessProbe"]["exec"]["command"]
        alive = container.exec_run(liveness)
        assert alive.exit_code == 0, alive.output
        container.exec_run(["python3", "-c", KILL_PIPELINE_STUB])
        dead = container.exec_run(liveness)
        assert dead.exit_code == 1 and b"stub process(es) died" in dead.output
        with urllib.request.urlopen(f"http://{by_port[8000]}{ready}") as response:
            assert response.status == 200  # readiness alone would not notice


def test_serving_image_refuses_an_image_without_our_health_check(docker_client):
    from builder.base.cpu import cpu_base_tag

    base = cpu_base_tag("3.11")
    try:
        docker_client.images.get(base)
    except Exception:  # noqa: BLE001 - no base here: nothing to check against
        pytest.skip(f"{base} is not on this engine")
    with pytest.raises(DeployError, match="no triton-builder health check"):
        deployable_image(base, client=docker_client)


# -- weights beside the image -----------------------------------------------------------------
BESIDE = DeployableImage("registry.example:5000/embed:3", gpu=False, weights_beside=True)


def test_a_stack_gives_each_node_one_weights_cache_for_its_replicas():
    from builder.runtime.supervisor.weights_lock import CACHE_DIR, CACHE_VOLUME

    document = stack_document(BESIDE, SwarmOptions(replicas=3))
    assert {"type": "volume", "source": CACHE_VOLUME, "target": CACHE_DIR} in \
        document["services"]["triton"]["volumes"]
    assert document["volumes"] == {CACHE_VOLUME: {}}
    assert "volumes" not in stack_document(CPU)


@pytest.mark.parametrize("host_path", [None, "/var/cache/triton-builder/weights"])
def test_pods_mount_a_weights_cache_and_validate(host_path):
    from builder.runtime.supervisor.weights_lock import CACHE_DIR

    options = kubernetes.KubernetesOptions(weights_host_path=host_path)
    documents = kubernetes.manifests(BESIDE, options)
    pod = documents["deployment"]["spec"]["template"]["spec"]
    (weights,) = [volume for volume in pod["volumes"] if volume["name"] == "weights"]
    assert weights == ({"name": "weights", "emptyDir": {}} if host_path is None else
                       {"name": "weights", "hostPath": {"path": host_path, "type": "Directory"}})
    assert {"name": "weights", "mountPath": CACHE_DIR} in pod["containers"][0]["volumeMounts"]
    for spec in (pod, documents["inferenceservice"]["spec"]["predictor"]):
        (init,) = spec["initContainers"]
        assert init["image"] == BESIDE.reference
        assert init["command"][-1] == "--fetch-weights"
        assert {"name": "weights", "mountPath": CACHE_DIR} in init["volumeMounts"]
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert len(kubernetes.validate(documents)) == 4 * len(kubernetes.SUPPORTED_KUBERNETES)
    plain = kubernetes.manifests(CPU)["deployment"]["spec"]["template"]["spec"]
    assert "weights" not in {volume["name"] for volume in plain["volumes"]}
    assert "initContainers" not in plain


def test_a_relative_weights_host_path_is_refused():
    with pytest.raises(DeployError, match="weights_host_path must be an absolute path"):
        kubernetes.KubernetesOptions(weights_host_path="cache")


# -- scaling on the queue ---------------------------------------------------------------------
@pytest.mark.parametrize("scale_on, metric, target", [
    ("queue", "triton_queue_ms_per_request", "20000m"),
    ("pending", "triton_pending_requests", "4000m")])
def test_the_autoscaler_scales_on_the_queue_beside_cpu_and_validates(scale_on, metric, target):
    documents = kubernetes.manifests(CPU, kubernetes.KubernetesOptions(scale_on=scale_on))
    cpu, pods = documents["hpa"]["spec"]["metrics"]
    assert cpu["resource"]["name"] == "cpu"
    assert pods == {"type": "Pods", "pods": {"metric": {"name": metric}, "target": {
        "type": "AverageValue", "averageValue": target}}}
    adapter = documents["adapter-rules"]
    assert adapter["kind"] == "ConfigMap" and adapter["metadata"]["name"] == "triton-adapter-rules"
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert '{<<.LabelMatchers>>,model="pipeline"}' in rule["metricsQuery"]
    assert "<<.GroupBy>>" in rule["metricsQuery"]
    assert len(kubernetes.validate(documents)) == 5 * len(kubernetes.SUPPORTED_KUBERNETES)


def test_the_queue_is_read_at_the_pipeline_model_the_images_signature_names():
    from builder.deploy.serving import _pipeline_model
    from builder.image.labels import SIGNATURE

    named = _pipeline_model({SIGNATURE: '{"pipelines": {"embed": {}}, "models": {}}'})
    assert named == "embed"
    assert _pipeline_model({}) == _pipeline_model({SIGNATURE: "not json"}) == "pipeline"
    image = DeployableImage("registry.example:5000/embed:2", gpu=False, pipeline_model=named)
    documents = kubernetes.manifests(image, kubernetes.KubernetesOptions(scale_on="pending"))
    (rule,) = yaml.safe_load(documents["adapter-rules"]["data"]["config.yaml"])["rules"]
    assert 'model="embed"' in rule["metricsQuery"], rule


def test_cpu_alone_writes_no_adapter_rules_and_an_unknown_metric_is_refused():
    documents = kubernetes.manifests(CPU)
    assert [m["type"] for m in documents["hpa"]["spec"]["metrics"]] == ["Resource"]
    assert "adapter-rules" not in documents
    with pytest.raises(DeployError, match="scale_on must be one of cpu, queue, pending"):
        kubernetes.KubernetesOptions(scale_on="latency")
    with pytest.raises(DeployError, match="must be positive"):
        kubernetes.KubernetesOptions(scale_on="queue", queue_target_ms=0)

"""``doctor --cuda``: the NVIDIA container runtime, the driver against the release's minimum and
against an environment's CUDA runtime.

No GPU here: the driver decisions are fed ``nvidia-smi --query-gpu=name,driver_version
--format=csv,noheader`` output as that command prints it, parsed by the doctor's own parser;
the container runtime check reads this machine's real ``docker info`` (no NVIDIA runtime).
Leftovers of killed builds are planted on the real engine, labelled by a process that really
exited.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile

import pytest

from builder.base.releases import resolve
from builder.cache import cache_dir
from builder.doctor import (
    cache_stagings_check,
    container_runtime_check,
    driver_check,
    environment_cuda_check,
    parse_nvidia_smi,
    run_checks,
)
from tests.support.staging_holder import StagingHolder

H100_550 = "NVIDIA H100 80GB HBM3, 550.54.15\n"
TWO_GPUS_535 = "Tesla T4, 535.183.01\nNVIDIA A10G, 535.183.01\n"
A100_580 = "NVIDIA A100-SXM4-40GB, 580.65.06\n"


def test_nvidia_smi_output_is_parsed():
    (gpu,) = parse_nvidia_smi(H100_550)
    assert (gpu.name, gpu.driver, gpu.driver_branch) == ("NVIDIA H100 80GB HBM3", "550.54.15",
                                                         550)
    assert [g.name for g in parse_nvidia_smi(TWO_GPUS_535)] == ["Tesla T4", "NVIDIA A10G"]
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver")


@pytest.mark.parametrize(("cuda", "smi", "status", "words"), [
    ("12.4", H100_550, "ok", "driver 550.54.15 (>= 550 for 24.05)"),
    ("12.6", H100_550, "fail", "needs >= 560"),
    ("13.0", TWO_GPUS_535, "fail", "Tesla T4 with driver 535.183.01; 25.11 needs >= 580"),
    ("12.4", A100_580, "ok", "A100"),
    ("cpu", "", "ok", "not needed"),
])
def test_the_driver_against_the_releases_minimum(cuda, smi, status, words):
    check = driver_check(resolve(cuda), parse_nvidia_smi(smi))
    assert check.status == status and words in check.detail


def test_a_release_note_below_the_toolkit_minimum_warns():
    check = driver_check(resolve("12.4", "24.03"), parse_nvidia_smi("Tesla T4, 545.23.08"))
    assert check.status == "warn" and "release notes ask for >= 545" in check.detail
    assert "CUDA 12.4 itself for >= 550" in check.detail


def test_no_gpu_here_warns_with_the_driver_to_install():
    check = driver_check(resolve("12.6"), [], "no nvidia-smi here")
    assert check.status == "warn" and "need driver >= 560" in check.detail


@pytest.mark.parametrize(("cuda", "runtime", "smi", "status", "words"), [
    ("12.4", "12.4", H100_550, "ok", "runs on driver 550.54.15 (>= 550)"),
    ("12.4", "12.1", H100_550, "ok", "(>= 530)"),
    ("12.8", "12.8", TWO_GPUS_535, "ok", "minor version compatibility (>= 525"),
    ("12.6", "13.0", A100_580, "fail", "CUDA runtime 13.0 needs driver >= 580, but 24.10"),
    ("11.8", "12.1", H100_550, "fail", "only needs driver >= 520"),
    ("13.0", "13.0", H100_550, "fail", "needs driver >= 580, this machine has 550.54.15"),
    ("12.4", None, H100_550, "ok", "no CUDA runtime"),
])
def test_the_environments_cuda_runtime_against_release_and_driver(cuda, runtime, smi, status,
                                                                  words):
    check = environment_cuda_check(resolve(cuda), parse_nvidia_smi(smi), runtime, "env.tar.gz")
    assert check.status == status, check.detail
    assert words in check.detail


def test_this_engine_has_no_nvidia_runtime(docker_client):
    info = docker_client.info()
    gpu = container_runtime_check(resolve("12.4"), info, None)
    assert gpu.status == "warn" and "verified on the CPU here (GPU placement not exercised)" \
        in gpu.detail
    assert "runc" in gpu.detail
    assert container_runtime_check(resolve(None), info, None).status == "ok"
    with_nvidia = {**info, "Runtimes": {**info.get("Runtimes", {}),
                                        "nvidia": {"path": "nvidia-container-runtime"}}}
    assert container_runtime_check(resolve("12.4"), with_nvidia, None).status == "ok"


def test_run_checks_for_a_gpu_release_on_this_machine(docker_client):
    """With the engine up (the fixture starts it), nothing fails on this GPU-less machine."""
    checks = {c.name: c for c in run_checks("12.4")}
    assert checks["release"].status == "ok"
    assert checks["nvidia container runtime"].status == "warn"
    assert checks["gpu driver"].status == "warn"
    assert not any(c.status == "fail" for c in checks.values())
    chosen = checks["environment cuda"]  # the torch a build would choose, from PyPI here
    assert chosen.status == "ok" and "torch a build would choose (torch==" in chosen.detail
    assert "carries CUDA runtime 12.4" in chosen.detail


def test_doctor_chooses_torch_for_the_python_the_build_carries():
    """22.12 runs Python 3.8, but a 3.11 builder's image carries 3.11 through the bridge: the
    torch doctor reports is the wheel for that Python (PyPI here, as the build resolves it)."""
    python = "{}.{}".format(*sys.version_info[:2])
    release = resolve("11.8")
    assert release.python_version == "3.8" and python != "3.8"
    chosen = {c.name: c for c in run_checks("11.8")}["environment cuda"]
    tag = "cp" + python.replace(".", "")
    assert f"for Python {python} (bridged)" in chosen.detail
    assert f"-{tag}-" in chosen.detail and "-cp38-" not in chosen.detail


@pytest.mark.alone  # removes every killed build's leftovers on the engine
def test_doctor_finds_and_removes_what_a_killed_build_left(docker_client, os_image, tmp_path):
    """Planted: a verification container labelled by a builder process that has exited (on an
    untagged image of its own, as a killed build's is), and one labelled by this live process.
    Only the first is a leftover; removing leftovers takes it and its image, nothing else."""
    import json
    import subprocess
    import uuid

    import docker.errors

    from builder.doctor import leftovers_check
    from builder.engine.container_lifecycle import remove_container
    from builder.engine.image_build import build_image
    from builder.engine.ownership import BuildOwner
    from builder.verify.verification import VERIFICATION_LABEL

    dead = json.loads(subprocess.run(
        [sys.executable, "-c", "import json; from builder.engine.ownership import BuildOwner; "
         "print(json.dumps(BuildOwner.here().labels()))"],
        capture_output=True, text=True, check=True).stdout)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {os_image}\nLABEL ai.triton-builder.test-orphan={uuid.uuid4().hex}\n")
    image = build_image(docker_client, tmp_path, []).id
    orphan = docker_client.containers.create(image, command=["true"],
                                             labels={**dead, VERIFICATION_LABEL: "1"})
    live = docker_client.containers.create(
        os_image, command=["true"], labels={**BuildOwner.here().labels(), VERIFICATION_LABEL: "1"})
    try:
        listed = leftovers_check(docker_client)
        assert listed.status == "warn", listed.detail
        assert orphan.name in listed.detail and f"pid {dead['ai.triton-builder.build.pid']}" \
            in listed.detail and "--remove-leftovers" in listed.detail
        assert live.name not in listed.detail
        removed = leftovers_check(docker_client, remove=True)
        assert removed.status == "ok" and orphan.name in removed.detail, removed.detail
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(orphan.id)
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(image)
        assert docker_client.containers.get(live.id).status == "created"
        assert docker_client.images.get(os_image)
        assert orphan.name not in leftovers_check(docker_client).detail
    finally:
        for container in (orphan, live):
            remove_container(docker_client, container.id)
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(image)

@pytest.mark.parametrize(("smi", "status", "words"), [
    ("NVIDIA A100-SXM4-40GB, 520.61.05\n", "fail",
     "the slim GPU route needs >= 525 (its server's CUDA 12.6 runtime"),
    ("NVIDIA A100-SXM4-40GB, 520.61.05\n", "fail",
     "use the NGC route for a CUDA this driver runs: --cuda 11.8 without --slim (22.12 needs "
     ">= 520)"),
    ("Tesla T4, 535.183.01\n", "warn", "by minor version compatibility (>= 525)"),
    (H100_550, "warn", "CUDA 12.6 itself asks for >= 560"),
    ("NVIDIA L4, 560.35.03\n", "ok", "driver 560.35.03"),
])
def test_the_driver_against_the_slim_routes_minimum(smi, status, words):
    check = driver_check(resolve("12.6", slim=True), parse_nvidia_smi(smi))
    assert check.status == status and words in check.detail, check


def test_a_driver_no_release_runs_gets_told_to_update():
    check = driver_check(resolve("12.6", slim=True), parse_nvidia_smi("Tesla K80, 440.118.02"))
    assert check.status == "fail" and "update the driver (no NGC release runs" in check.detail


def test_doctor_refuses_a_cuda_the_slim_route_cannot_serve_naming_the_ngc_route():
    (check,) = run_checks("11.8", slim=True)
    assert (check.name, check.status) == ("release", "fail")
    assert "--cuda 11.8 without --slim" in check.detail


def test_doctor_lists_and_removes_the_cache_entries_killed_builds_left_half_written(
        tmp_path, monkeypatch):
    """A staging no living process holds is listed with its size, and removed on request; one
    a running build fills is not. So with builds' working directories in the temporary
    directory."""
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    killed = StagingHolder(cache_dir("environments") / "0123abcd")
    living = StagingHolder(cache_dir("stubs", "r24.12") / "stub")
    killed_build = StagingHolder(temporary=tmp_path / "tmp")
    living_build = StagingHolder(temporary=tmp_path / "tmp")
    killed.kill()
    killed_build.kill()
    try:
        listed = cache_stagings_check()
        assert listed.status == "warn" and "1 half-written entry" in listed.detail
        assert str(killed.staging) in listed.detail and "(1 MiB)" in listed.detail
        assert "1 working directory of killed builds (1 MiB)" in listed.detail, listed
        assert str(killed_build.staging) in listed.detail
        assert str(living.staging) not in listed.detail
        assert str(living_build.staging) not in listed.detail
        removed = cache_stagings_check(remove=True)
        assert removed.status == "ok" and str(killed.staging) in removed.detail
        assert str(killed_build.staging) in removed.detail
        assert not killed.staging.exists() and living.staging.is_dir()
        assert not killed_build.staging.exists() and living_build.staging.is_dir()
        assert cache_stagings_check().status == "ok"
    finally:
        assert living.finish() == 0
        assert living_build.finish() == 0

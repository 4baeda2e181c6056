"""Specs from files and operators merge into one environment; attach rewrites real configs.

Fast: no Docker, no server, no network.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.environment.archive_check import check_archive
from builder.environment.attach import STUB_FILE, attach_environment
from builder.environment.errors import (
    ArchiveCheckError,
    EnvironmentBuildError,
    PackError,
    SpecError,
)
from builder.environment.index import PackageIndex
from builder.environment.packers import CondaPacker, VenvPacker, choose_packer
from builder.environment.spec import (
    load_spec,
    merge_specs,
    missing_requirements,
    operator_requirements,
    read_spec,
    requirements_spec,
    requires,
)
from builder.environment.stub_rpath import patchelf
from builder.environment.tarball import EnvironmentTarball
from builder.environment.target import EnvironmentTarget, host_target
from tests.support.paths import REPO_ROOT

ENVS = REPO_ROOT / "envs"


def test_requirements_file_with_include_and_comments(tmp_path):
    (tmp_path / "base.txt").write_text("numpy==1.26.4  # the stub needs <2\n")
    (tmp_path / "model.txt").write_text("# the model\n-r base.txt\n\nTabulate>=0.9\n")
    spec = read_spec(tmp_path / "model.txt")
    assert spec.requirements == ("numpy==1.26.4", "Tabulate>=0.9")
    assert spec.where("numpy==1.26.4") == f"{tmp_path / 'base.txt'}:1"
    assert not spec.conda


def test_options_and_unparsable_lines_are_refused_with_the_fix(tmp_path):
    (tmp_path / "a.txt").write_text("--index-url https://mirror/simple\n")
    with pytest.raises(SpecError, match="build options"):
        read_spec(tmp_path / "a.txt")
    (tmp_path / "b.txt").write_text("./local/package\n")
    with pytest.raises(SpecError, match=r"(?s)b\.txt:1.*name @ file:///"):
        read_spec(tmp_path / "b.txt")


def test_operators_declare_requirements():
    @requires("tabulate==0.9.0")
    def render(x):
        return x

    class Embed:
        requirements = ["numpy<2"]

        def __call__(self, x):
            return x

    def plain(x):
        return x

    spec = operator_requirements([functools.partial(render), Embed(), plain, render])
    assert spec.requirements == ("numpy<2", "tabulate==0.9.0")
    assert "operator test_operators_declare_requirements.<locals>.render" in spec.where(
        "tabulate==0.9.0")

    class Broken:
        requirements = "numpy<2"

    with pytest.raises(SpecError, match="must be a list"):
        operator_requirements([Broken()])


def test_merge_is_order_independent_and_refuses_disagreeing_pins():
    a = requirements_spec(["tabulate==0.9.0", "numpy<2"], "envs/a.txt")
    b = requirements_spec(["numpy<2"], "operator embed")
    assert merge_specs(a, b).canonical() == merge_specs(b, a).canonical()
    assert merge_specs(a, b).where("numpy<2") == "envs/a.txt, operator embed"
    c = requirements_spec(["tabulate==0.8.10"], "operator table")
    with pytest.raises(SpecError, match=r"tabulate is pinned to different versions.*"
                                        r"==0\.8\.10 from operator table.*==0\.9\.0"):
        merge_specs(a, c)


def test_environment_yml_merges_with_pip_requirements_and_pins_the_stub_python(tmp_path):
    spec = load_spec([ENVS / "tabulate-demo.yml"], requirements=["humanize==4.9.0"])
    assert spec.conda and spec.channels == ("conda-forge",)
    assert "numpy=1.26.4" in spec.conda_dependencies
    assert "humanize==4.9.0" in spec.requirements and "tabulate==0.9.0" in spec.requirements
    document = json.loads(spec.environment_yml("3.11"))
    assert document["dependencies"][0] == "python=3.11"
    assert document["dependencies"][-1] == {"pip": list(spec.requirements)}
    (tmp_path / "py312.yml").write_text("dependencies: [python=3.12, numpy<2]\n")
    with pytest.raises(SpecError, match=r"python=3\.12.*stub runs Python 3\.11"):
        read_spec(tmp_path / "py312.yml").environment_yml("3.11")


def test_packer_follows_the_spec_and_can_be_overridden():
    requirements = read_spec(ENVS / "tabulate-demo.txt")
    conda = read_spec(ENVS / "tabulate-demo.yml")
    assert isinstance(choose_packer(requirements), VenvPacker)
    assert isinstance(choose_packer(conda), CondaPacker)
    assert isinstance(choose_packer(requirements, "conda"), CondaPacker)
    with pytest.raises(PackError, match="use the conda packer"):
        choose_packer(conda, "venv")


def test_package_index_options(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    index = PackageIndex(index_url="https://mirror.example/simple",
                         extra_index_urls=("https://private.example/simple",),
                         find_links=("/srv/wheels",), ca_bundle=bundle)
    assert index.pip_arguments() == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "https://private.example/simple",
        "--find-links", "/srv/wheels", "--cert", str(bundle)]
    assert index.environment()["REQUESTS_CA_BUNDLE"] == str(bundle)
    assert index.fingerprint() == PackageIndex(
        index_url="https://mirror.example/simple",
        extra_index_urls=("https://private.example/simple",),
        find_links=("/srv/wheels",)).fingerprint(), "the CA bundle must not change the key"
    (tmp_path / "empty.pem").write_text("not a certificate")
    with pytest.raises(PackError, match="holds no PEM certificate"):
        PackageIndex(ca_bundle=tmp_path / "empty.pem").pip_arguments()


def test_platform_tags_follow_the_target_glibc():
    tags = host_target().platform_tags()
    assert tags[0].startswith("manylinux_2_") and "manylinux2014_x86_64" in tags
    assert tags[-1] == "linux_x86_64"


def _repository(root: Path) -> Path:
    for name, backend in (("pre", "python"), ("post", "python"), ("linear", "onnxruntime")):
        (root / name / "1").mkdir(parents=True)
        config = mc.ModelConfig(name=name, backend=backend, max_batch_size=4)
        config.parameters["keep"].string_value = "me"
        (root / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root


def test_attach_puts_one_file_in_the_repository_and_links_it(tmp_path):
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"\x1f\x8b not checked here")
    lock = tmp_path / "lock.txt"
    lock.write_text("numpy==1.26.4\n")
    tarball = EnvironmentTarball(path=archive, lock=lock, key="k", packer="venv",
                                 python_version="3.11", numpy_version="1.26.4", reused=False)
    repository = _repository(tmp_path / "models")
    assert attach_environment(repository, tarball) == ["post", "pre"]
    assert (repository / "post" / "environment.tar.gz").read_bytes() == archive.read_bytes()
    assert (repository / "post" / "environment.lock.txt").read_text() == "numpy==1.26.4\n"
    assert (repository / "pre" / "environment.tar.gz").readlink() == Path(
        "../post/environment.tar.gz")
    assert not (repository / "linear" / "environment.tar.gz").exists()
    for name in ("pre", "post"):
        config = mc.ModelConfig()
        text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
        assert config.parameters["EXECUTION_ENV_PATH"].string_value == (
            "$$TRITON_MODEL_DIRECTORY/environment.tar.gz")
        assert config.parameters["keep"].string_value == "me"
    assert attach_environment(repository, tarball) == ["post", "pre"], "attach is repeatable"
    with pytest.raises(EnvironmentBuildError, match="not python-backend models.*linear"):
        attach_environment(repository, tarball, models=["linear"])


def test_a_bridged_repository_shares_one_stub_and_one_unpacked_environment(tmp_path):
    """The CPU base bridged: python and (Python-based) onnxruntime models, one stub, one
    directory environment (two backends must not extract archives at the same time)."""
    prefix = tmp_path / "env"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "activate").write_text("export PATH\n")
    (prefix / "bin" / "python3").symlink_to("python3.11")
    archive = tmp_path / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        for path in sorted(prefix.rglob("*")):
            packed.add(path, arcname=str(path.relative_to(prefix)), recursive=False)
    stub = tmp_path / "stub"
    shutil.copyfile("/bin/true", stub)  # an ELF executable, as a stub is
    tarball = EnvironmentTarball(path=archive, lock=None, key="k", packer="interpreter",
                                 python_version="3.11", numpy_version="1.26.4", reused=False)
    repository = _repository(tmp_path / "models")
    attached = attach_environment(repository, tarball, stub=stub, unpacked=True,
                                  backends=("python", "onnxruntime"))
    assert attached == ["linear", "post", "pre"]
    holder = repository / "linear"
    assert (holder / "environment" / "bin" / "activate").read_text() == "export PATH\n"
    assert (holder / "environment" / "bin" / "python3").readlink() == Path("python3.11")
    assert (holder / STUB_FILE).stat().st_mode & 0o111
    rpath = subprocess.run([patchelf(), "--print-rpath", str(holder / STUB_FILE)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert rpath == "$ORIGIN/environment/lib", "the probe run of the stub finds its libpython"
    assert subprocess.run([str(repository / "pre" / STUB_FILE)]).returncode == 0
    for name in ("pre", "post"):
        assert (repository / name / "environment").readlink() == Path("../linear/environment")
        assert (repository / name / STUB_FILE).readlink() == Path(f"../linear/{STUB_FILE}")
        config = mc.ModelConfig()
        text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
        assert config.parameters["EXECUTION_ENV_PATH"].string_value == (
            "$$TRITON_MODEL_DIRECTORY/environment")


def test_onnx_platform_models_count_as_onnxruntime_ones(tmp_path):
    root = tmp_path / "models"
    (root / "encoder" / "1").mkdir(parents=True)
    config = mc.ModelConfig(name="encoder", platform="onnxruntime_onnx", max_batch_size=4)
    (root / "encoder" / "config.pbtxt").write_text(text_format.MessageToString(config))
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"\x1f\x8b not checked here")
    tarball = EnvironmentTarball(path=archive, lock=None, key="k", packer="interpreter",
                                 python_version="3.11", numpy_version="1.26.4", reused=False)
    assert attach_environment(root, tarball) == []
    assert attach_environment(root, tarball, backends=("python", "onnxruntime")) == ["encoder"]


def _carried_archive(tmp_path: Path, *, libpython: bool) -> Path:
    prefix = tmp_path / "carried"
    files = {"bin/activate": 'export PYTHONHOME="$_prefix"\n', "bin/python3.11": "ELF",
             "lib/python3.11/os.py": "", "lib/python3.11/site-packages/numpy/__init__.py": "",
             "lib/python3.11/site-packages/numpy-1.26.4.dist-info/METADATA": ""}
    if libpython:
        files["lib/libpython3.11.so.1.0"] = "ELF"
    for name, text in files.items():
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_text(text)
    archive = tmp_path / f"carried-{libpython}.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        for path in sorted(prefix.rglob("*")):
            packed.add(path, arcname=str(path.relative_to(prefix)), recursive=False)
    shutil.rmtree(prefix)
    return archive


def test_an_environment_that_carries_its_interpreter_is_checked_as_such(tmp_path):
    target = EnvironmentTarget(
        python_version="3.11", full_python_version="3.11.2",
        python_executable="/usr/bin/python3.11", interpreter_dirs=("/usr/bin",),
        stub_python_version="3.11", machine="x86_64", glibc_version="2.36",
        triton_version="2.51.0")
    report = check_archive(_carried_archive(tmp_path, libpython=True), target)
    assert (report.layout, report.python_version, report.numpy_version) == (
        "interpreter", "3.11", "1.26.4")
    with pytest.raises(ArchiveCheckError, match="without lib/libpython3.11.so.1.0"):
        check_archive(_carried_archive(tmp_path, libpython=False), target)


def test_requirements_the_spec_already_names_keep_the_specs_pin():
    spec = requirements_spec(["onnxruntime==1.32.0", "numpy==1.26.4"], "pipe.pickle")
    assert missing_requirements(spec, ["ONNXRuntime==1.31.1", "tabulate==0.9.0"]) == [
        "tabulate==0.9.0"]

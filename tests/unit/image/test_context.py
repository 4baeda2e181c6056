"""Sorting a model repository into the serving image's layers (no engine needed)."""

from __future__ import annotations

import os
import tarfile

import pytest

from builder.base.releases import resolve
from builder.image.context import (
    ENVIRONMENTS_DIR,
    LARGE_FILE,
    REPOSITORY_PART,
    BuildContextError,
    environment_image_path,
    plan_context,
)
from builder.image.serving_image import (
    EnvironmentMismatchError,
    check_environment_python,
    environment_python,
)


@pytest.fixture
def repository(tmp_path):
    """A repository shaped like what the pipeline and environment builders write."""
    root = tmp_path / "models"
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text('name: "pipeline"\nbackend: "python"\n')
    (root / "pipeline" / "1" / "model.py").write_text("class TritonPythonModel: ...\n")
    (root / "pipeline" / "1" / "pipe.pickle").write_bytes(b"\x80\x04small")
    (root / "pipeline" / "1" / "__pycache__").mkdir()
    (root / "pipeline" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")
    (root / "pipeline" / "environment.tar.gz").write_bytes(b"env")
    (root / "encoder" / "1").mkdir(parents=True)
    (root / "encoder" / "config.pbtxt").write_text('name: "encoder"\n')
    (root / "encoder" / "1" / "model.onnx").write_bytes(b"onnx")
    (root / "encoder" / "1" / "model.onnx.data").write_bytes(b"external weights")
    (root / "post" / "1").mkdir(parents=True)
    (root / "post" / "config.pbtxt").write_text('name: "post"\nbackend: "python"\n')
    (root / "post" / "1" / "model.py").write_text("class TritonPythonModel: ...\n")
    (root / "post" / "environment.tar.gz").symlink_to("../pipeline/environment.tar.gz")
    (root / "post" / "2").mkdir()
    return root


def _layers(plan):
    return {layer: [e.path for e in plan.layer(layer)] for layer in
            ("environment", "weights", "code")}


def test_files_are_sorted_by_how_often_they_change(repository):
    layers = _layers(plan_context(repository))
    assert layers["environment"] == ["environment/models/pipeline/environment.tar.gz",
                                     "environment/models/post/environment.tar.gz"]
    assert layers["weights"] == ["weights/encoder/models/encoder/1/model.onnx",
                                 "weights/encoder/models/encoder/1/model.onnx.data"]
    assert layers["code"] == [
        "code/models/encoder/config.pbtxt", "code/models/pipeline/1/model.py",
        "code/models/pipeline/1/pipe.pickle", "code/models/pipeline/config.pbtxt",
        "code/models/post/1/model.py", "code/models/post/2", "code/models/post/config.pbtxt"]


def test_a_symlink_inside_the_repository_stays_a_link_in_its_targets_layer(repository, tmp_path):
    plan = plan_context(repository)
    link = [e for e in plan.entries if e.path.endswith("post/environment.tar.gz")][0]
    assert link.layer == "environment" and link.link == "../pipeline/environment.tar.gz"
    context = plan.write(tmp_path / "context", ["environment", "weights", "code"])
    written = context / "environment/models/post/environment.tar.gz"
    assert written.is_symlink() and written.read_bytes() == b"env"
    assert (context / "code/models/post/2").is_dir()
    assert not list(context.rglob("*.pyc"))


def test_a_symlink_leaving_the_repository_is_replaced_by_its_target(repository, tmp_path):
    outside = tmp_path / "big.safetensors"
    outside.write_bytes(b"weights")
    (repository / "encoder" / "1" / "extra.safetensors").symlink_to(outside)
    plan = plan_context(repository)
    entry = [e for e in plan.entries if e.path.endswith("extra.safetensors")][0]
    assert entry.layer == "weights" and entry.link is None and entry.source == outside


def test_large_files_count_as_weights_whatever_their_name(repository):
    with open(repository / "pipeline" / "1" / "vocabulary.txt", "wb") as stream:
        stream.truncate(LARGE_FILE)
    assert ("weights/pipeline/models/pipeline/1/vocabulary.txt"
            in _layers(plan_context(repository))["weights"])


def test_an_unpacked_environment_directory_is_an_environment(repository):
    env = repository / "pipeline" / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "activate").write_text("")
    (env / "lib").mkdir()
    (env / "lib" / "x.py").write_text("")
    layers = _layers(plan_context(repository))
    assert "environment/models/pipeline/env/lib/x.py" in layers["environment"]


def test_an_environments_interpreter_linked_outside_is_copied_once_into_the_environment(
        repository, tmp_path):
    """A virtual environment's bin/python, python3 and python3.11 point at the host's
    interpreter (6.8 MB): before, each became a copy of it in the code layer, so a code-only
    change pushed 20 MB."""
    interpreter = tmp_path / "host" / "python3.11"
    interpreter.parent.mkdir()
    interpreter.write_bytes(b"\x7fELF interpreter")
    interpreter.chmod(0o755)
    env = repository / "pipeline" / "environment"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "activate").write_text("")
    for name in ("python", "python3", "python3.11"):
        (env / "bin" / name).symlink_to(interpreter)
    plan = plan_context(repository)
    entries = {e.path.rsplit("/", 1)[1]: e for e in plan.entries if "/bin/python" in e.path}
    assert {e.layer for e in entries.values()} == {"environment"}
    assert entries["python"].source == interpreter and entries["python"].link is None
    assert entries["python3"].link == entries["python3.11"].link == "python"
    context = plan.write(tmp_path / "context", ["environment"])
    assert (context / "environment/models/pipeline/environment/bin/python3.11").read_bytes() == (
        b"\x7fELF interpreter")
    assert not any("bin/python" in e.path for e in plan.layer("code"))


def test_each_models_weights_are_a_part_of_their_own_largest_first(repository):
    (repository / "head" / "1").mkdir(parents=True)
    (repository / "head" / "1" / "model.onnx").write_bytes(b"h" * 10)
    (repository / "encoder" / "1" / "model.onnx.data").write_bytes(b"e" * 1000)
    (repository / "tokenizer.safetensors").write_bytes(b"t" * 100)
    plan = plan_context(repository)
    assert plan.weight_parts() == ("encoder", REPOSITORY_PART, "head")
    assert plan.part_size("encoder") == 4 + 1000 and plan.part_size("head") == 10
    assert [e.path for e in plan.layer("weights") if e.part == REPOSITORY_PART] == [
        f"weights/{REPOSITORY_PART}/models/tokenizer.safetensors"]
    assert {e.part for e in plan.layer("code")} == {"code"}


def test_a_new_version_of_one_model_changes_only_its_parts_files(repository):
    (repository / "head" / "1").mkdir(parents=True)
    (repository / "head" / "1" / "model.onnx").write_bytes(b"head 1")
    before = {e.path: e.source.read_bytes() for e in plan_context(repository).layer("weights")}
    (repository / "head" / "1" / "model.onnx").write_bytes(b"head 2")
    after = {e.path: e.source.read_bytes() for e in plan_context(repository).layer("weights")}
    changed = {path for path in before if before[path] != after[path]}
    assert changed == {"weights/head/models/head/1/model.onnx"}


def test_explicit_environments_go_to_their_own_directory(repository, tmp_path):
    tarball = tmp_path / "shared-env.tar.gz"
    tarball.write_bytes(b"e")
    plan = plan_context(repository, environments=[tarball])
    assert environment_image_path(tarball) == f"{ENVIRONMENTS_DIR}/shared-env.tar.gz"
    assert f"environment{ENVIRONMENTS_DIR}/shared-env.tar.gz" in _layers(plan)["environment"]
    with pytest.raises(BuildContextError, match="not found"):
        plan_context(repository, environments=[tmp_path / "missing.tar.gz"])


def test_a_code_change_changes_only_the_code_digest(repository):
    plan = plan_context(repository)
    before = {layer: plan.digest(layer) for layer in ("environment", "weights", "code")}
    (repository / "post" / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
    plan = plan_context(repository)
    after = {layer: plan.digest(layer) for layer in ("environment", "weights", "code")}
    assert before["environment"] == after["environment"]
    assert before["weights"] == after["weights"]
    assert before["code"] != after["code"]


def test_context_files_are_hard_linked_not_copied(repository, tmp_path):
    plan = plan_context(repository)
    context = plan.write(tmp_path / "context", ["weights"])
    source = repository / "encoder" / "1" / "model.onnx"
    assert (os.stat(context / "weights/encoder/models/encoder/1/model.onnx").st_ino
            == os.stat(source).st_ino)
    assert not (context / "code").exists()


def _venv_tarball(path, python):
    with tarfile.open(path, "w:gz") as archive:
        for name in ("bin/activate", f"lib/python{python}/site-packages/numpy/__init__.py"):
            info = tarfile.TarInfo(name)
            archive.addfile(info)
    return path


def test_the_environments_python_must_be_the_releases(tmp_path):
    tarball = _venv_tarball(tmp_path / "env.tar.gz", "3.11")
    assert environment_python(tarball) == "3.11"
    check_environment_python(tarball, resolve(None))
    with pytest.raises(EnvironmentMismatchError, match="Python 3.11.*Python 3.10"):
        check_environment_python(tarball, resolve("12.4"))
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a tarball")
    with pytest.raises(EnvironmentMismatchError, match="not a readable tarball"):
        environment_python(broken)

"""One environment shared by python models on a real host-process Triton, and the tarball cache.

The venv is really built (by this host's Python, from wheels pip downloads) and packed with
venv-pack; the server is the real tritonserver 2.51, and the probe model refuses to answer unless
``tabulate`` comes from the extracted environment (the host's test environment has it too).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.environment.attach import attach_environment
from builder.environment.index import PackageIndex
from builder.environment.packers import VenvPacker
from builder.environment.spec import load_spec, requirements_spec
from builder.environment.tarball import environment_key, pack_environment
from builder.environment.target import host_target
from tests.support.paths import MODELS, REPO_ROOT

pytestmark = pytest.mark.alongside

PROBE_MODEL = MODELS / "env_probe.py"
SPEC = REPO_ROOT / "envs" / "tabulate-demo.txt"
EXTRACTION = re.compile(r'Extracting Python execution env (\S+?)"')


def write_probe_repository(root: Path, names: list[str]) -> Path:
    """Python models (``X`` FP32 matrix → ``Y`` = [table, sys.prefix, numpy version])."""
    for name in names:
        (root / name / "1").mkdir(parents=True)
        shutil.copy(PROBE_MODEL, root / name / "1" / "model.py")
        config = mc.ModelConfig(
            name=name, backend="python", max_batch_size=0,
            input=[mc.ModelInput(name="X", data_type=mc.TYPE_FP32, dims=[-1, -1])],
            output=[mc.ModelOutput(name="Y", data_type=mc.TYPE_STRING, dims=[3])],
        )
        (root / name / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root


def probe(url: str, model: str) -> tuple[str, str, str]:
    with grpcclient.InferenceServerClient(url) as client:
        x = grpcclient.InferInput("X", [2, 2], "FP32")
        x.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
        table, prefix, numpy_version = client.infer(model, [x]).as_numpy("Y")
    return table.decode(), prefix.decode(), numpy_version.decode()


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("environments")


@pytest.fixture(scope="module")
def host_tarball(env_cache):
    return pack_environment(load_spec([SPEC]), host_target(), cache=env_cache)


@pytest.mark.slow
def test_models_sharing_the_environment_extract_it_once(host_tarball, tmp_path, triton_server):
    """Two models reach one file (one directly, one by symlink): one extraction, one prefix.

    A third model holds a *copy* of the tarball: the control that shows the log line counts
    extractions (Triton extracts a copy again).
    """
    repository = write_probe_repository(tmp_path / "models", ["alpha", "beta", "gamma"])
    assert attach_environment(repository, host_tarball, models=["alpha", "beta"]) == [
        "alpha", "beta"]
    assert (repository / "beta" / "environment.tar.gz").readlink() == Path(
        "../alpha/environment.tar.gz")
    assert "tabulate==" in (repository / "alpha" / "environment.lock.txt").read_text()
    shutil.copy2(host_tarball.path, repository / "gamma" / "environment.tar.gz")
    gamma = mc.ModelConfig()
    text_format.Parse((repository / "gamma" / "config.pbtxt").read_text(), gamma)
    gamma.parameters["EXECUTION_ENV_PATH"].string_value = (
        "$$TRITON_MODEL_DIRECTORY/environment.tar.gz")
    (repository / "gamma" / "config.pbtxt").write_text(text_format.MessageToString(gamma))

    server = triton_server(repository, log_verbose=1)
    answers = {name: probe(server.grpc_url, name) for name in ("alpha", "beta", "gamma")}
    for table, prefix, numpy_version in answers.values():
        assert table == "1  2\n3  4"
        assert prefix.startswith("/tmp/python_env_")
        assert numpy_version == host_tarball.numpy_version
    assert answers["alpha"][1] == answers["beta"][1] != answers["gamma"][1]
    extracted = EXTRACTION.findall(server.logs())
    assert sorted(Path(p).parent.name for p in extracted) == ["alpha", "gamma"], extracted


@pytest.mark.slow
def test_unchanged_spec_reuses_the_cached_tarball(host_tarball, env_cache):
    """Same spec (in any order) → same key and file; a changed spec → new key.

    How fast a reuse is lives in BENCHMARKS.md (benchmarks/bench_environment.py)."""
    again = pack_environment(load_spec([SPEC]), host_target(), cache=env_cache)
    assert again.reused and again.path == host_tarball.path and again.key == host_tarball.key
    reordered = requirements_spec(reversed(load_spec([SPEC]).requirements), "reordered")
    assert pack_environment(reordered, host_target(), cache=env_cache).key == host_tarball.key
    changed = requirements_spec(["numpy==1.26.4", "tabulate==0.10.0"], "changed")
    assert environment_key(changed, host_target(), VenvPacker(), PackageIndex()) != (
        host_tarball.key)

"""Build-time package sources and CA certificates reach the real pip that fetches the wheels.

Network: PyPI, through this machine's intercepting HTTPS proxy (its CA is in the system bundle).
pip's machine configuration is switched off here so only the options under test are in play.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.environment.errors import PackError
from builder.environment.index import PackageIndex
from builder.environment.packers import download_wheels
from builder.environment.spec import requirements_spec
from builder.environment.tarball import pack_environment
from builder.environment.target import host_target

pytestmark = [pytest.mark.slow, pytest.mark.alongside]

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
OTHER_CA = Path("/etc/ssl/certs/ISRG_Root_X1.pem")  # a real root CA, not the proxy's


@pytest.fixture
def bare_pip(monkeypatch):
    """pip with no machine configuration (no mirrors, find-links or certificate settings)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")  # a cached index page would skip the TLS check
    for name in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)


def private_wheel(tmp_path: Path) -> Path:
    """A real wheel of a package that exists on no index: ``tb-private-greeting`` 1.0."""
    project = tmp_path / "project"
    (project / "tb_private_greeting").mkdir(parents=True)
    (project / "tb_private_greeting" / "__init__.py").write_text("GREETING = 'hello'\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "tb-private-greeting"\nversion = "1.0"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(wheels), str(project)],
                   check=True, capture_output=True)
    return wheels


def test_find_links_brings_a_private_package_into_the_environment(tmp_path):
    spec = requirements_spec(["numpy==1.26.4", "tb-private-greeting==1.0"], "test")
    with pytest.raises(PackError, match="(?s)could not download.*tb-private-greeting"):
        pack_environment(spec, host_target(), cache=tmp_path / "cache")
    index = PackageIndex(find_links=(str(private_wheel(tmp_path)),))
    tarball = pack_environment(spec, host_target(), index=index, cache=tmp_path / "cache")
    assert "tb-private-greeting==1.0" in tarball.lock.read_text()


def test_ca_bundle_lets_pip_through_a_proxy_the_trust_store_does_not_know(
        bare_pip, tmp_path, monkeypatch):
    """A host whose trust store lacks the intercepting proxy's CA (simulated: only another
    real root CA is trusted) cannot fetch wheels; given the proxy's CA as ``ca_bundle``, it can.

    Both pip's own certificate handling and truststore (pip >= 24.2, which reads the system
    store) are covered: the system store is pointed at the other CA and an empty directory.
    """
    monkeypatch.setenv("SSL_CERT_FILE", str(OTHER_CA))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "no-certificates"))
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(OTHER_CA))
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("tabulate==0.9.0\n")
    (tmp_path / "constraints.txt").write_text("\n")
    args = (requirements, tmp_path / "constraints.txt", host_target())
    pypi = "https://pypi.org/simple"
    with pytest.raises(PackError, match="(?s)CERTIFICATE_VERIFY_FAILED.*pass the CA bundle"):
        download_wheels(*args, tmp_path / "refused", PackageIndex(index_url=pypi))
    download_wheels(*args, tmp_path / "trusted",
                    PackageIndex(index_url=pypi, ca_bundle=SYSTEM_BUNDLE))
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "trusted").iterdir()) == [
        "pip", "tabulate"]

"""The CPU base's Python packages, installed into the cache by real pip from PyPI: two
processes installing the same set at once (two builds, two pytest-xdist workers on an empty
cache) both get every package, and the cache keeps one whole copy.

``tabulate`` stands in for the backend's packages: one small pure-Python wheel, the same for
every platform tag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.base.cpu import _python_packages
from builder.cache import cache_dir
from builder.engine.platforms import DEFAULT_PLATFORM
from tests.support.at_once import at_once

REQUIREMENTS = "tabulate==0.9.0\n"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))


def _install_and_list(requirements: str) -> list[str]:
    """Install, then list what the returned directory holds at once, as the build copies it."""
    site_packages = _python_packages(requirements, "3.11", DEFAULT_PLATFORM)
    return sorted(str(p.relative_to(site_packages)) for p in site_packages.rglob("*")
                  if p.is_file())


def test_two_processes_installing_at_once_both_get_every_package():
    first, second = at_once(_install_and_list, [(REQUIREMENTS,)] * 2, timeout=300)
    assert "tabulate/__init__.py" in first and "tabulate-0.9.0.dist-info/RECORD" in first
    assert second == first
    assert _install_and_list(REQUIREMENTS) == first
    held = [p.name for p in cache_dir("base-python").iterdir()]
    assert len(held) == 1 and not held[0].count(".partial"), held

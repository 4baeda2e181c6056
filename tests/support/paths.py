"""Where the tests' data lives: one place, so a test file can move without its paths breaking."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS.parent
GOLDEN = TESTS / "golden"
"""Rendered Dockerfiles the templates must keep producing, byte for byte."""
IMAGES = TESTS / "images"
"""Dockerfiles of the stand-ins for what only Docker Hub and NGC hold."""
MODELS = TESTS / "models"
"""Python-backend models the tests serve."""
TRITON_SOURCES = REPO_ROOT.parent / "shared" / "triton-sources"
"""Triton's source tarballs beside the checkout (``../shared/triton-sources``)."""

"""The Docker engine and what every stage asks of it: reaching (or starting) the daemon,
rendering Dockerfiles from the templates, building through the SDK with the log streamed.

Shared plumbing, below the stages: the base images, the serving image and the test bed build
through the same :func:`builder.engine.image_build.build_image`.
"""

from builder.engine.daemon import EngineError, docker_client, ensure_engine
from builder.engine.leftovers import Leftovers
from builder.engine.reference import tag_references

__all__ = [
    "EngineError",
    "Leftovers",
    "docker_client",
    "ensure_engine",
    "tag_references",
]

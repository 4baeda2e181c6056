"""The Docker engine and what every stage asks of it: reaching (or starting) the daemon,
rendering Dockerfiles from the templates, building through the SDK with the log streamed.

Shared plumbing, below the stages: the base images, the serving image and the test bed build
through the same :func:`builder.engine.image_build.build_image`.
"""

from builder.engine.daemon import EngineError, docker_client, ensure_engine
from builder.engine.emulation import EmulationMissingError, PlatformSupport, require_platforms
from builder.engine.leftovers import Leftovers
from builder.engine.platforms import (
    DEFAULT_PLATFORM,
    Platform,
    UnknownPlatformError,
    parse_platform,
    parse_platforms,
    platform_option,
    platform_references,
)
from builder.engine.reference import ImageReference, tag_references
from builder.engine.registry import registry_insecure

__all__ = [
    "ImageReference",
    "registry_insecure",
    "DEFAULT_PLATFORM",
    "EmulationMissingError",
    "PlatformSupport",
    "EngineError",
    "Leftovers",
    "Platform",
    "UnknownPlatformError",
    "docker_client",
    "ensure_engine",
    "parse_platform",
    "parse_platforms",
    "platform_option",
    "platform_references",
    "require_platforms",
    "tag_references",
]

"""Stage 6, publishing: pushes through the Docker SDK, confirmed with the registry."""

from builder.push.docker_push import PushResult, push_image

__all__ = ["PushResult", "push_image"]

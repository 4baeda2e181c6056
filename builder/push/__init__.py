"""Publishing: a verified image tagged, then pushed through the Docker SDK and confirmed
with the registry."""

from builder.push.docker_push import PushError, PushResult, push_image
from builder.push.image_index import IndexPushResult, push_index
from builder.push.tags import tag_image

__all__ = ["IndexPushResult", "PushError", "PushResult", "push_image", "push_index", "tag_image"]

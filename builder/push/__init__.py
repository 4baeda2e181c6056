"""Publishing: a verified image tagged, then pushed through the Docker SDK and confirmed
with the registry."""

from builder.push.docker_push import PushError, PushResult, push_image
from builder.push.image_index import IndexPushResult, push_index
from builder.push.tags import tag_image
from builder.push.weights_artifact import WeightsArtifact, push_lock_weights

__all__ = ["IndexPushResult", "PushError", "PushResult", "WeightsArtifact", "push_image",
           "push_index", "push_lock_weights", "tag_image"]

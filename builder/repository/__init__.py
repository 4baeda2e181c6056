"""The model repository: model operators exported, configs written as protobuf, the
pipeline model beside them."""

from builder.repository.batching import MAX_BATCH_SIZE
from builder.repository.export import TOLERANCE as EXPORT_TOLERANCE
from builder.repository.options import RepositoryOptions
from builder.repository.writer import BuildResult, build_pipeline_model

__all__ = ["EXPORT_TOLERANCE", "MAX_BATCH_SIZE", "BuildResult", "RepositoryOptions",
           "build_pipeline_model"]

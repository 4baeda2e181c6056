"""The model repository: model operators exported, configs written as protobuf, the
pipeline model beside them."""

from builder.repository.writer import BuildResult, build_pipeline_model

__all__ = ["BuildResult", "build_pipeline_model"]

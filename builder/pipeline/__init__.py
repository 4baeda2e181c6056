"""The pipeline: the DSL, its DAG and executor, operators, typed signatures, and the
capture of all of it (user code included) into ``pipe.pickle``."""

from builder.pipeline.dsl import Pipeline, pipe
from builder.pipeline.operators import ModelOp
from builder.pipeline.rejection import rejects
from builder.pipeline.row_independence import check_row_independence
from builder.pipeline.signature import Array, List, TensorSpec
from builder.pipeline.vectorized import vectorized

__all__ = ["Array", "List", "ModelOp", "Pipeline", "TensorSpec", "check_row_independence",
           "pipe", "rejects", "vectorized"]

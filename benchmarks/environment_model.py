"""A python-backend ``model.py`` that loads torch from its execution environment and says which.

The CUDA environment benchmark serves it with ``EXECUTION_ENV_PATH`` pointing at a GPU
release's environment: ``initialize`` imports torch as a torch model does (the CUDA libraries
load with it, no GPU needed), so the time to ready holds the import and the backend's work on
the environment (extraction of an archive, or none for a directory), and ``execute`` answers
``OUTPUT`` (``TYPE_STRING``, one element) with ``torch.__version__`` and the CUDA torch was
built for, which proves the environment, not the host, served it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import torch

        self.answer = f"{torch.__version__} cuda={torch.version.cuda} from {torch.__file__}"

    def execute(self, requests: list[Any]) -> list[Any]:
        output = np.array([self.answer.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", output)])
                for _ in requests]

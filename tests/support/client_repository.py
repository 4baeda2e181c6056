"""A served model for the client tests that the sample repository lacks: strings and slowness.

``echo`` (python backend, batching) takes ``TEXT`` (``TYPE_STRING`` [1]) and ``DELAY``
(``TYPE_FP32`` [1], seconds to sleep, so timeouts can be provoked on a real server) and returns
``UPPER`` (the text upper-cased) and ``LENGTH`` (``TYPE_INT64`` [1], its length in characters).
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ECHO_MODEL = '''\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            if delay is not None:
                time.sleep(float(delay.as_numpy().max()))
            decoded = [[t.decode("utf-8") for t in row] for row in text]
            upper = np.array([[t.upper().encode("utf-8") for t in row] for row in decoded],
                             dtype=object)
            length = np.array([[len(t) for t in row] for row in decoded], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]))
        return responses
'''


def write_client_repository(root: Path) -> Path:
    """Write the ``echo`` model under ``root``."""
    echo = root / "echo"
    (echo / "1").mkdir(parents=True)
    (echo / "1" / "model.py").write_text(ECHO_MODEL)
    config = mc.ModelConfig(
        name="echo", backend="python", max_batch_size=16,
        input=[mc.ModelInput(name="TEXT", data_type=mc.TYPE_STRING, dims=[1]),
               mc.ModelInput(name="DELAY", data_type=mc.TYPE_FP32, dims=[1], optional=True)],
        output=[mc.ModelOutput(name="UPPER", data_type=mc.TYPE_STRING, dims=[1]),
                mc.ModelOutput(name="LENGTH", data_type=mc.TYPE_INT64, dims=[1])],
    )
    (echo / "config.pbtxt").write_text(text_format.MessageToString(config))
    return root

"""A python-backend model that runs only inside its packed environment: it imports ``tabulate``.

``Y`` holds the table ``tabulate`` makes of ``X``, then ``sys.prefix`` (where the environment
was extracted), then numpy's version — what the environment tests check.
"""

import sys

import numpy as np
import tabulate  # no base image has it; the host's test environment does, for the host tests
import triton_python_backend_utils as pb_utils

if not tabulate.__file__.startswith(sys.prefix):
    raise ImportError(f"tabulate came from {tabulate.__file__}, not the environment {sys.prefix}")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            table = tabulate.tabulate(x.tolist(), tablefmt="plain")
            y = np.array([table.encode(), sys.prefix.encode(), np.__version__.encode()],
                         dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses

"""A hand-written python-backend ``model.py`` doing a pipeline's work: what users write today.

The serving benchmark copies it to ``<repository>/handwritten/1/model.py``, beside the built
pipeline model, with the pipeline model's inputs, outputs, batching and instance count. For each
request of a dynamic batch, as Triton's python-backend examples do: decode the input, the
pipeline's pre-processing functions, one ONNX Runtime run (the session options of the pipeline
model), its post-processing, one response (``Workload.by_hand``). No DAG, no types checked, no
batching across requests.

Against it, the pipeline model's overhead at one request in flight splits into what the
pipeline's own Python operators cost as served (the hand-written model pays it too) and what
the pipeline model adds; at 32 in flight it shows what batching across requests buys.

Its config's parameters: ``workload`` (``text`` or ``image``), ``model`` (the ONNX file) and
``root`` (this checkout, put on ``sys.path`` to import the workload).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config["parameters"].items()}
        sys.path.insert(0, parameters["root"])
        import onnxruntime as ort

        from benchmarks.bench_serving import WORKLOADS
        from builder.runtime.model_calls import cpu_session_options

        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        self.workload = WORKLOADS[parameters["workload"]](0)
        self.session = ort.InferenceSession(
            parameters["model"], sess_options=cpu_session_options(ort, instances),
            providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def execute(self, requests: list) -> list:
        workload = self.workload
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, workload.input_name)
            results = [workload.by_hand(self.session, self.input_names, item)
                       for item in workload.items_of(tensor.as_numpy())]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, array)
                for name, array in workload.answer(results).items()]))
        return responses

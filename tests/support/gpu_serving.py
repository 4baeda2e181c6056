"""The GPU tier's checks, written once for any device.

What is served: the text-embedding example written by the builder with its model operator
(``text_encoder``, a torch module) exported in the ``python`` format and placed by
``op_config={"device": device}`` — ``KIND_GPU`` or ``KIND_CPU`` — with the pipeline model on the
CPU calling it over BLS, by Triton 2.51 from the nvidia-pytriton wheel as a host process (no
Docker, no network: as on a GPU machine lent for a test run). ``tests/gpu`` runs these checks on
the GPU; ``tests/e2e/test_gpu_tier_on_cpu.py`` runs the same ones with the operator on the CPU, so
that everything but the GPU itself is exercised on every machine.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as grpcclient
from tritonclient.grpc import model_config_pb2 as mc

from builder import build_pipeline_model
from builder.client.pipeline import Client
from builder.repository.model_config import read_config
from builder.tritonserver.host_process import TritonServer
from builder.verify.container import ContainerEndpoint
from builder.verify.equality import check_same
from pipelines.text_embedding import TinyEncoder, Tokenizer, pipeline
from pipelines.weights import load_weights
from tests.support.example_inputs import TEXTS

OPERATOR = "text_encoder"
KINDS = {"gpu": mc.ModelInstanceGroup.KIND_GPU, "cpu": mc.ModelInstanceGroup.KIND_CPU}
TOLERANCE = 1e-4
"""The same bound as every served-equals-in-process check (cuBLAS and the CPU differ ~1e-6)."""


@dataclass(frozen=True)
class Served:
    server: TritonServer
    repository: Path
    device: str

    @property
    def endpoint(self) -> ContainerEndpoint:
        """The server's ports in the form placement verification reads them."""
        return ContainerEndpoint(self.server.http_url, self.server.grpc_url,
                                 f"127.0.0.1:{self.server.metrics_port}", "host tritonserver")


@contextmanager
def served_text_embedding(root: Path, device: str, log_verbose: int = 0) -> Iterator[Served]:
    """Write the repository with the operator on ``device`` and serve it (``log_verbose`` 1:
    Triton logs each warm-up sample it runs)."""
    build_pipeline_model(pipeline, root, format_priority=("python",),
                         op_defaults={"device": device}, in_process=False)
    config = read_config(root / OPERATOR)
    assert config.backend == "python", "the operator is not in the python format"
    assert [group.kind for group in config.instance_group] == [KINDS[device]], config
    with TritonServer(root, log_verbose=log_verbose) as server:
        yield Served(server, root, device)


def warmed_before_ready(served: Served) -> None:
    """Right after ready, before any client request: the operator's loaded config carries
    ``model_warmup`` at batch sizes within its ``max_batch_size`` on the ``device``'s instance
    kind, and Triton's log (verbose 1) shows each sample run through the operator's instance
    while it loaded. Then the operator's first 21 requests, one row each, one at a time, answered
    as in process; the first's latency against the median of the next 20 is printed (a figure,
    never a bound)."""
    with grpcclient.InferenceServerClient(served.server.grpc_url) as client:
        config = client.get_model_config(OPERATOR).config
        assert [group.kind for group in config.instance_group] == [KINDS[served.device]], \
            config
        samples = list(config.model_warmup)
        assert samples, f"{OPERATOR}'s loaded config has no model_warmup"
        assert all(1 <= sample.batch_size <= max(config.max_batch_size, 1)
                   for sample in samples), samples
        log = served.server.logs()
        for sample in samples:
            ran = rf"model '{OPERATOR}' instance \S+ is running warmup sample " \
                  rf"'{re.escape(sample.name)}'"
            assert re.search(ran, log), f"no {ran!r} in the server's log"
        latencies, answers = [], []
        for text in TEXTS[:21]:
            inputs = _operator_inputs([text])
            started = time.perf_counter()
            answers.append(client.infer(OPERATOR, inputs).as_numpy("output_0"))
            latencies.append(time.perf_counter() - started)
    expected = _in_process(TEXTS[:21])
    np.testing.assert_allclose(np.concatenate(answers), expected, atol=TOLERANCE, rtol=0)
    rest = statistics.median(latencies[1:])
    print(f"first request after ready {latencies[0] * 1000:.2f} ms, median of the next 20 "
          f"{rest * 1000:.2f} ms ({latencies[0] / rest:.2f}x)")


def _tokens(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    tokenizer = Tokenizer()
    ids, mask = (np.stack(arrays) for arrays in zip(*(tokenizer(text) for text in texts)))
    return ids, mask


def _operator_inputs(texts: list[str]) -> list[grpcclient.InferInput]:
    ids, mask = _tokens(texts)
    inputs = [grpcclient.InferInput("ids", list(ids.shape), "INT64"),
              grpcclient.InferInput("mask", list(mask.shape), "FP32")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    return inputs


def _in_process(texts: list[str]) -> np.ndarray:
    ids, mask = _tokens(texts)
    module = load_weights(TinyEncoder, OPERATOR, seed=0).eval()
    with torch.no_grad():
        return module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()


def operator_answers(served: Served, texts: list[str]) -> None:
    """The operator, called directly with a batch, answers as the module does in process."""
    with grpcclient.InferenceServerClient(served.server.grpc_url) as client:
        answer = client.infer(OPERATOR, _operator_inputs(texts)).as_numpy("output_0")
    np.testing.assert_allclose(answer, _in_process(texts), atol=TOLERANCE, rtol=0)


def pipeline_answers(served: Served, concurrency: int = 8) -> None:
    """The pipeline model answers as the pipeline does in process: one call at a time, then
    ``concurrency`` clients at once (Triton batches them; BLS carries the batches)."""
    url = f"grpc://{served.server.grpc_url}/pipeline"
    with Client(url) as client:
        for text in TEXTS:
            check_same(client(text), pipeline(text), TOLERANCE, f"pipeline({text!r})")
    problems: list[str] = []

    def one_client(offset: int) -> None:
        with Client(url) as client:
            for text in TEXTS[offset::concurrency]:
                try:
                    check_same(client(text), pipeline(text), TOLERANCE, f"pipeline({text!r})")
                except Exception as error:  # noqa: BLE001 - collected, raised below
                    problems.append(str(error))

    threads = [threading.Thread(target=one_client, args=(n,)) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not problems, problems[:3]

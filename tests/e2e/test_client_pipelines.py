"""Served pipelines answer like in-process ones: through ``Client``/``AsyncClient``, through a raw
``tritonclient`` request and through a plain KServe v2 JSON request, over gRPC and HTTP.

Every example pipeline in ``pipelines/`` is built with ``build_pipeline_model`` and served, with
its own examples as inputs, next to ``kinds``, a pipeline of this module that returns one value
of every Python kind (``str``, ``int``, ``float``, ``bool``, ``bytes``, a list) and fails on
purpose for ``n == 0``. One server serves all the repositories (starting Triton costs seconds).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import pkgutil
import struct
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import pipelines
from builder import Pipeline, build_pipeline_model, pipe
from builder.client.aio import AsyncClient
from builder.client.codec import NotAPipelineError, read_signature
from builder.client.errors import RemoteModelError
from builder.client.pipeline import Client
from builder.client.served_model import ServedModel, ServedTensor
from builder.errors import InputError
from builder.pipeline.signature_document import signature_parameter
from builder.tritonserver.host_process import TritonServer
from builder.verify.equality import check_same

pytestmark = pytest.mark.alongside

SCHEMES = ("grpc", "http")
ATOL = 1e-4  # served model operators run in onnxruntime, in-process ones in torch


def describe(text: str, n: int):
    words = text.split()
    return (text.upper(), len(words) // n, len(text) / len(words), len(words) > n,
            text[::-1].encode(), words)


def kinds_pipeline() -> Pipeline:
    return (pipe.input("text", "n")
            .map(("text", "n"), ("upper", "count", "mean", "long", "raw", "words"), describe)
            .output("upper", "count", "mean", "long", "raw", "words")
            .with_example("one two three", 2)
            .with_example("four five", 1))


KINDS_CALLS = [("héllo wörld again", 1), ("a", 3), ("x y z w", 2)]


@dataclass
class Served:
    pipeline: Pipeline
    calls: list[tuple[Any, ...]]


def example_pipelines() -> dict[str, Served]:
    found = {}
    for module_info in pkgutil.iter_modules(pipelines.__path__):
        module = importlib.import_module(f"pipelines.{module_info.name}")
        pipeline = getattr(module, "pipeline", None)
        if isinstance(pipeline, Pipeline):
            found[module_info.name] = Served(pipeline, list(pipeline.examples))
    return found


@pytest.fixture(scope="module")
def served() -> dict[str, Served]:
    return {**example_pipelines(), "kinds": Served(kinds_pipeline(), KINDS_CALLS)}


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    repositories = []
    for name, entry in served.items():
        result = build_pipeline_model(entry.pipeline, root / name, name=name)
        repositories.append(result.model_root)
    first, *others = repositories
    with TritonServer(first, extra_args=tuple(f"--model-repository={r}" for r in others)) as s:
        yield s


def url(server: TritonServer, scheme: str, model: str) -> str:
    return f"{scheme}://{server.grpc_url if scheme == 'grpc' else server.http_url}/{model}"


def assert_same(remote: Any, local: Any, where: str) -> None:
    check_same(remote, local, ATOL, where)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_client_returns_what_the_pipeline_returns(server, served, scheme):
    for name, entry in served.items():
        expected = [entry.pipeline(*call) for call in entry.calls]
        with Client(url(server, scheme, name)) as client:
            for call, local in zip(entry.calls, expected):
                assert_same(client(*call), local, f"{name}{call!r:.40}")
            batch = [call if len(call) > 1 else call[0] for call in entry.calls * 3]
            assert_same(client.batch(batch), expected * 3, f"{name} batch")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_async_client_returns_what_the_pipeline_returns(server, served, scheme):
    async def main() -> dict[str, tuple[Any, list]]:
        answers = {}
        for name, entry in served.items():
            async with AsyncClient(url(server, scheme, name), max_in_flight=3) as client:
                one = await client(*entry.calls[0])
                answers[name] = one, await client.batch(entry.calls * 2)
        return answers

    for name, (one, batch) in asyncio.run(main()).items():
        entry = served[name]
        expected = [entry.pipeline(*call) for call in entry.calls]
        assert_same(one, expected[0], name)
        assert_same(batch, expected * 2, f"{name} batch")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_pipeline_errors_and_wrong_inputs(server, scheme):
    with Client(url(server, scheme, "kinds")) as kinds:
        with pytest.raises(InputError, match="takes 2 inputs"):
            kinds("only text")
        with pytest.raises(InputError, match="input 'n' of pipeline 'kinds'"):
            kinds("text", "not an int")
        with pytest.raises(InputError, match="input 'text' of pipeline 'kinds'.*UTF-8"):
            kinds("lone \ud800 surrogate", 1)
        with pytest.raises(RemoteModelError, match="ZeroDivisionError") as failed:
            kinds("fails for n == 0", 0)
        assert failed.value.status in ("StatusCode.INTERNAL", "500")
        results = kinds.batch([("a b", 1), ("c", 0), ("d e f", 2)], return_exceptions=True)
        assert isinstance(results[1], RemoteModelError)
        assert results[0][1] == 2 and results[2][1] == 1
    with Client(url(server, scheme, "text_encoder")) as not_a_pipeline:
        with pytest.raises(NotAPipelineError, match="TritonRemoteModel"):
            not_a_pipeline("hello")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_invalid_utf8_text_is_the_clients_fault(server, scheme):
    """Bytes that are not UTF-8 in a str input: INVALID_ARGUMENT / 400, not a server fault."""
    module = grpcclient if scheme == "grpc" else httpclient
    address = server.grpc_url if scheme == "grpc" else server.http_url
    text = np.array([[b"caf\xe9 \xff"]], dtype=object)
    n = np.array([[1]], dtype=np.int64)
    with module.InferenceServerClient(address) as client:
        inputs = [module.InferInput("text", [1, 1], "BYTES"),
                  module.InferInput("n", [1, 1], "INT64")]
        inputs[0].set_data_from_numpy(text)
        inputs[1].set_data_from_numpy(n)
        with pytest.raises(Exception) as refused:
            client.infer("kinds", inputs)
    assert refused.value.status() == ("StatusCode.INVALID_ARGUMENT" if scheme == "grpc" else "400")
    assert "input 'text'" in refused.value.message() and "not UTF-8" in refused.value.message()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_raw_tritonclient_request(server, served, scheme):
    """Plain typed tensors: a tritonclient user needs nothing of ours."""
    module = grpcclient if scheme == "grpc" else httpclient
    address = server.grpc_url if scheme == "grpc" else server.http_url
    with module.InferenceServerClient(address) as client:
        for name, entry in served.items():
            config = client.get_model_config(name, **({"as_json": True} if scheme == "grpc"
                                                      else {}))
            config = config.get("config", config)
            for call in entry.calls:
                inputs = []
                for tensor, value in zip(config["input"], call):
                    array = raw_tensor(value, tensor["data_type"])
                    datatype = "BYTES" if array.dtype == object else tensor["data_type"][5:]
                    inputs.append(module.InferInput(tensor["name"], list(array.shape), datatype))
                    inputs[-1].set_data_from_numpy(array)
                result = client.infer(name, inputs)
                local = entry.pipeline(*call)
                local = local if len(config["output"]) > 1 else (local,)
                for tensor, expected in zip(config["output"], local):
                    assert_same(raw_value(result.as_numpy(tensor["name"])[0], expected),
                                expected, f"{name} {tensor['name']}")


@pytest.mark.slow
def test_kserve_v2_json_request(server, served):
    """A plain HTTP POST of KServe v2 JSON (Triton's binary extension only for non-UTF-8
    bytes, which JSON cannot carry)."""
    for name, entry in served.items():
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}/config") as r:
            config = json.load(r)
        for call in entry.calls:
            body, headers = kserve_request(config, call)
            request = urllib.request.Request(
                f"http://{server.http_url}/v2/models/{name}/infer", data=body,
                headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.load(response)
            outputs = {o["name"]: o for o in answer["outputs"]}
            local = entry.pipeline(*call)
            local = local if len(config["output"]) > 1 else (local,)
            for tensor, expected in zip(config["output"], local):
                output = outputs[tensor["name"]]
                data = np.array(output["data"], dtype=object if output["datatype"] == "BYTES"
                                else None).reshape(output["shape"])
                if output["datatype"] == "BYTES":
                    data = np.vectorize(str.encode, otypes=[object])(data)
                assert_same(raw_value(data[0], expected), expected, f"{name} {tensor['name']}")


def test_signature_parameter_round_trips_and_is_checked_against_the_tensors():
    signature = kinds_pipeline().signature()
    parameters = signature_parameter(signature)
    served = ServedModel(
        name="kinds", version="1", max_batch_size=8,
        inputs=tuple(ServedTensor(n, _wire(s.dtype), s.served_dims)
                     for n, s in signature.inputs.items()),
        outputs=tuple(ServedTensor(n, _wire(s.dtype), s.served_dims)
                      for n, s in signature.outputs.items()),
        parameters=parameters,
    )
    assert read_signature(served) == signature
    with pytest.raises(NotAPipelineError, match="no 'pipeline_signature'"):
        read_signature(ServedModel("m", "1", 8, served.inputs, served.outputs, {}))
    renamed = (ServedTensor("other", "BYTES", (1,)), *served.inputs[1:])
    with pytest.raises(NotAPipelineError, match="rebuild the repository"):
        read_signature(ServedModel("m", "1", 8, renamed, served.outputs, parameters))
    future = {"pipeline_signature": parameters["pipeline_signature"].replace(
        '"version":1', '"version":2')}
    with pytest.raises(NotAPipelineError, match="format version 2"):
        read_signature(ServedModel("m", "1", 8, served.inputs, served.outputs, future))


def _wire(dtype: str) -> str:
    return "BYTES" if dtype == "TYPE_STRING" else dtype[len("TYPE_"):]


# -- what a user without our client would write ---------------------------------------------
def raw_tensor(value: Any, data_type: str) -> np.ndarray:
    """One call's value as a batch of one, by hand: strings as bytes objects, numbers as is."""
    if isinstance(value, str | bytes):
        return np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)
    dtype = {"TYPE_FP32": np.float32, "TYPE_FP64": np.float64, "TYPE_INT64": np.int64,
             "TYPE_INT32": np.int32, "TYPE_UINT8": np.uint8, "TYPE_BOOL": bool}[data_type]
    array = np.asarray(value, dtype=dtype)
    return array.reshape(1, *(array.shape or (1,)))


def raw_value(array: np.ndarray, like: Any) -> Any:
    """One call's output tensor read back by hand into the type of ``like``."""
    if isinstance(like, np.ndarray):
        return array.astype(like.dtype)
    if isinstance(like, list | tuple):
        return type(like)(raw_value(np.asarray(item), element)
                          for item, element in zip(array, like))
    item = array.reshape(-1)[0] if isinstance(array, np.ndarray) else array
    if isinstance(like, str):
        return item.decode("utf-8")
    return type(like)(item)


def kserve_request(config: dict, call: tuple) -> tuple[bytes, dict[str, str]]:
    """The JSON body of an infer request; non-UTF-8 bytes go as binary data after it."""
    inputs, binary = [], b""
    for tensor, value in zip(config["input"], call):
        array = raw_tensor(value, tensor["data_type"])
        entry = {"name": tensor["name"], "shape": list(array.shape)}
        if array.dtype != object:
            entry |= {"datatype": tensor["data_type"][5:], "data": array.reshape(-1).tolist()}
        else:
            items = list(array.reshape(-1))
            try:
                entry |= {"datatype": "BYTES", "data": [i.decode("utf-8") for i in items]}
            except UnicodeDecodeError:
                data = b"".join(struct.pack("<I", len(i)) + i for i in items)
                entry |= {"datatype": "BYTES", "parameters": {"binary_data_size": len(data)}}
                binary += data
        inputs.append(entry)
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(len(header))}
    return header + binary, headers

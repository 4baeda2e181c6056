"""The client's decisions that need no server: URLs, value conversion, retry pacing, fan-out.

Everything a server would only answer with an obscure error (or silently misread) is decided
here, so it is checked here, fast: the served behaviour is in ``test_client_remote.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from builder.client.coercion import bind, prepare
from builder.client.endpoint import parse_endpoint
from builder.client.errors import ServerUnavailableError
from builder.client.fanout import amap_bounded, map_bounded
from builder.client.retry import RetryPolicy, call_with_retry
from builder.client.served_model import ServedModel, ServedTensor, served_model
from builder.errors import InputError

LINEAR = ServedModel(
    name="linear", version="1", max_batch_size=8,
    inputs=(ServedTensor("INPUT", "FP32", (4,)), ServedTensor("IDS", "INT32", (-1,), True),
            ServedTensor("TEXT", "BYTES", (1,), True)),
    outputs=(ServedTensor("OUTPUT", "FP32", (3,)),),
)


@pytest.mark.parametrize("url, kwargs, expected", [
    ("grpc://127.0.0.1:8001/linear", {}, ("grpc", "127.0.0.1:8001", "linear", "")),
    ("http://host:8000/v2/models/linear/versions/2", {}, ("http", "host:8000", "linear", "2")),
    ("127.0.0.1:9000", {"scheme": "grpc", "model": "m"}, ("grpc", "127.0.0.1:9000", "m", "")),
    ("https://host:443/m", {}, ("http", "host:443", "m", "")),
])
def test_endpoint_from_url_and_arguments(url, kwargs, expected):
    endpoint = parse_endpoint(url, **kwargs)
    assert (endpoint.scheme, endpoint.address, endpoint.model, endpoint.version) == expected


@pytest.mark.parametrize("url, kwargs, message", [
    ("127.0.0.1:8001/m", {}, "does not say the protocol"),
    ("ftp://h:1/m", {}, "unsupported scheme"),
    ("grpc://h:1", {}, "does not name a model"),
    ("grpc://h/m", {}, "needs a host and a port"),
    ("grpc://h:1/a", {"model": "b"}, "contradicts"),
])
def test_endpoint_errors_say_what_to_write(url, kwargs, message):
    with pytest.raises(ValueError, match=message):
        parse_endpoint(url, **kwargs)


def test_model_spec_reads_both_protocols_json():
    """gRPC's JSON writes int64 as strings and wraps the config; HTTP's does neither."""
    metadata = {"name": "m", "versions": ["1"], "inputs": [
        {"name": "X", "datatype": "FP32", "shape": ["-1", "4"]}], "outputs": [
        {"name": "Y", "datatype": "BYTES", "shape": ["-1", "1"]}]}
    grpc_config = {"config": {"max_batch_size": 8, "input": [
        {"name": "X", "data_type": "TYPE_FP32", "dims": ["4"]}], "output": [
        {"name": "Y", "data_type": "TYPE_STRING", "dims": ["1"]}],
        "parameters": {"k": {"string_value": "v"}}}}
    http_config = {"max_batch_size": 8, "input": [
        {"name": "X", "data_type": "TYPE_FP32", "dims": [4]}], "output": [
        {"name": "Y", "data_type": "TYPE_STRING", "dims": [1]}],
        "parameters": {"k": {"string_value": "v"}}}
    assert served_model(metadata, grpc_config) == served_model(metadata, http_config)
    spec = served_model(metadata, http_config)
    assert spec.inputs[0] == ServedTensor("X", "FP32", (4,))
    assert spec.outputs[0].datatype == "BYTES" and spec.parameters == {"k": "v"}


def test_one_sample_gets_a_batch_dimension_and_is_converted():
    request = prepare(LINEAR, bind(LINEAR, ([1, 2, 3, 4],), {"TEXT": ["héllo"]}))
    assert request.single
    assert request.tensors["INPUT"].dtype == np.float32
    assert request.tensors["INPUT"].shape == (1, 4)
    assert request.tensors["TEXT"].tolist() == [["héllo".encode()]]

    batch = prepare(LINEAR, bind(LINEAR, (np.ones((3, 4)),), {"IDS": [[1], [2], [3]]}))
    assert not batch.single and batch.tensors["IDS"].dtype == np.int32


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, r"needs input\(s\) INPUT: INPUT: FP32 \[batch, 4\]"),
    (([1, 2, 3, 4], [1], ["a"], 4), {}, "takes 3 inputs"),
    (([1, 2, 3, 4],), {"WRONG": 1}, "has no input 'WRONG'; its inputs are INPUT, IDS, TEXT"),
    (([1, 2, 3, 4],), {"INPUT": 1}, "given twice"),
    (([1, 2, 3],), {}, r"'INPUT' .* expects FP32 \[batch, 4\], got shape \(3,\)"),
    ((np.ones((2, 2, 4)),), {}, r"'INPUT' .* rank 1 \(one sample\) or 2 \(a batch\)"),
    ((["a", "b", "c", "d"],), {}, "'INPUT' .* expects numbers .*got strings"),
    (([1, 2, 3, 4],), {"IDS": [1.5]}, "'IDS' .* expects integers .*got floats"),
    (([1, 2, 3, 4],), {"IDS": [2**40]}, "'IDS' .* expects INT32 in"),
    (([1, 2, 3, 4],), {"TEXT": [3]}, "'TEXT' .* expects str or bytes"),
    (([1, 2, 3, 4],), {"TEXT": ["\ud800"]}, "'TEXT' .*'\\\\ud800' cannot be sent as UTF-8"),
    ((np.ones((9, 4)),), {}, "batch of 9, the model takes 1 to 8"),
    ((np.ones((2, 4)),), {"IDS": [7]}, "one sample or every input as a batch"),
    ((np.ones((2, 4)),), {"IDS": [[7], [8], [9]]}, "different batch sizes"),
])
def test_wrong_inputs_are_refused_naming_the_input(args, kwargs, message):
    with pytest.raises(InputError, match=message):
        prepare(LINEAR, bind(LINEAR, args, kwargs))


def test_retry_policy_backs_off_exponentially_up_to_a_cap():
    delays = list(RetryPolicy(retries=6, initial_delay=0.1, max_delay=1.0, jitter=0).delays())
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_only_unavailable_is_retried():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ServerUnavailableError("not yet")
        return "ok"

    policy = RetryPolicy(retries=5, initial_delay=0.001)
    assert call_with_retry(flaky, policy) == "ok" and len(attempts) == 3

    attempts.clear()
    with pytest.raises(ServerUnavailableError, match=r"gave up after 2 attempts"):
        call_with_retry(flaky, RetryPolicy(retries=1, initial_delay=0.001))

    def wrong():
        attempts.append(1)
        raise InputError("no")

    attempts.clear()
    with pytest.raises(InputError):
        call_with_retry(wrong, policy)
    assert len(attempts) == 1


def test_fan_out_keeps_order_and_bounds_the_calls_in_flight():
    running, peak, lock = [0], [0], threading.Lock()

    def call(item: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01 * (item % 3))
        with lock:
            running[0] -= 1
        return item * 10

    with ThreadPoolExecutor(8) as executor:
        results = list(map_bounded(call, iter(range(30)), 3, executor))
    assert results == [i * 10 for i in range(30)]
    assert peak[0] <= 3


def test_async_fan_out_keeps_order_and_bounds_the_calls_in_flight():
    running, peak = [0], [0]

    async def call(item: int) -> int:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.01 * (item % 3))
        running[0] -= 1
        return item * 10

    assert asyncio.run(amap_bounded(call, iter(range(30)), 3)) == [i * 10 for i in range(30)]
    assert peak[0] == 3

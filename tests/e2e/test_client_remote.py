"""``TritonRemoteModel`` and its asyncio twin against a real host-process Triton, both protocols.

One server serves the sample repository (a python and an ONNX model) and the ``echo`` string
model for the whole module: starting Triton costs seconds and the machine has two cores. The
retry test starts its own servers, since it stops and restarts them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.client.aio import AsyncTritonRemoteModel
from builder.client.errors import RemoteTimeoutError
from builder.client.remote_model import TritonRemoteModel
from builder.client.retry import RetryPolicy
from builder.errors import InputError
from builder.tritonserver.host_process import TritonServer, free_ports
from tests.support.client_repository import write_client_repository
from tests.support.sample_repository import (
    FEATURES,
    expected_linear,
    expected_scale,
    write_sample_repository,
)

pytestmark = [pytest.mark.slow, pytest.mark.light]  # a host server; a retry waits on a restart

SCHEMES = ("grpc", "http")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("client") / "models"
    write_client_repository(write_sample_repository(root))
    with TritonServer(root) as running:
        yield running


def url(server: TritonServer, scheme: str, model: str) -> str:
    address = server.grpc_url if scheme == "grpc" else server.http_url
    return f"{scheme}://{address}/{model}"


def inference_count(server: TritonServer, model: str) -> int:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        (stats,) = client.get_inference_statistics(model).model_stats
    return stats.inference_count


@pytest.mark.parametrize("scheme", SCHEMES)
def test_values_in_arrays_out(server, scheme):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, FEATURES)).astype(np.float32)
    with TritonRemoteModel(url(server, scheme, "linear")) as linear:
        one = linear(x[0].tolist())  # a list of Python floats, one sample
        assert list(one) == ["OUTPUT"] and one["OUTPUT"].shape == (3,)
        np.testing.assert_allclose(one["OUTPUT"], expected_linear(x[:1])[0], atol=1e-5)
        np.testing.assert_allclose(linear(INPUT=x)["OUTPUT"], expected_linear(x), atol=1e-5)
        many = linear.batch(list(x))
        np.testing.assert_allclose(np.stack([r["OUTPUT"] for r in many]), expected_linear(x),
                                   atol=1e-5)

    address = server.grpc_url if scheme == "grpc" else server.http_url  # no scheme, no model
    with TritonRemoteModel(address, "scale", scheme) as scale:
        np.testing.assert_array_equal(scale(X=np.arange(4))["Y"], expected_scale(np.arange(4.0)))

    with TritonRemoteModel(url(server, scheme, "echo")) as echo:
        one = echo(["héllo"])
        assert one["UPPER"].tolist() == ["HÉLLO".encode()] and one["LENGTH"].tolist() == [5]
        batch = echo(TEXT=[["a"], [b"bc"]])
        assert batch["UPPER"].tolist() == [[b"A"], [b"BC"]]
        assert batch["LENGTH"].dtype == np.int64 and batch["LENGTH"].tolist() == [[1], [2]]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_wrong_inputs_fail_before_anything_is_sent(server, scheme):
    before = inference_count(server, "linear")
    with TritonRemoteModel(url(server, scheme, "linear")) as linear:
        for args, kwargs, message in [
            ((), {"X": [1.0] * 4}, "has no input 'X'; its inputs are INPUT"),
            (([1.0, 2.0],), {}, r"'INPUT' of model 'linear' expects FP32 \[batch, 4\]"),
            ((["a"] * 4,), {}, "'INPUT' of model 'linear' expects numbers"),
        ]:
            with pytest.raises(InputError, match=message):
                linear(*args, **kwargs)
        with pytest.raises(InputError, match="'INPUT'"):  # one bad item: none is sent
            linear.batch([[1.0] * 4, [1.0] * 3])
    assert inference_count(server, "linear") == before


@pytest.mark.parametrize("scheme", SCHEMES)
def test_asyncio_client_matches(server, scheme):
    x = np.random.default_rng(1).standard_normal((12, FEATURES)).astype(np.float32)

    async def main():
        async with AsyncTritonRemoteModel(url(server, scheme, "linear"), max_in_flight=4) as m:
            one = await m(x[0])
            many = await m.batch(list(x))
            with pytest.raises(InputError, match="'INPUT'"):
                await m([1.0])
        async with AsyncTritonRemoteModel(url(server, scheme, "echo")) as echo:
            text = await echo.infer({"TEXT": ["ß"]})
        return one, many, text

    one, many, text = asyncio.run(main())
    np.testing.assert_allclose(one["OUTPUT"], expected_linear(x[:1])[0], atol=1e-5)
    np.testing.assert_allclose(np.stack([r["OUTPUT"] for r in many]), expected_linear(x),
                               atol=1e-5)
    assert text["UPPER"].tolist() == [b"SS"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_timeout_is_raised_not_retried(server, scheme, caplog):
    caplog.set_level(logging.INFO, logger="builder.client.retry")
    with TritonRemoteModel(url(server, scheme, "echo"), timeout=0.5, retries=3) as echo:
        with pytest.raises(RemoteTimeoutError, match="echo"):
            echo(["slow"], DELAY=[1.5])
    assert not caplog.records, "a timed-out request was retried"
    time.sleep(1.2)  # let the one model instance finish the slow request


def test_retries_until_the_server_is_up_and_again_after_a_restart(tmp_path, caplog):
    """Clients made before their server exists wait for it; a restart is ridden out.

    The server is pinned to ports chosen in advance (the clients must know them before it
    starts); everything else is real: refused connections, a real restart. Closed clients
    leave no connection open (Triton waits for open HTTP connections when it stops).
    """
    root = write_sample_repository(tmp_path / "models")
    ports = free_ports(3)
    http_port, grpc_port, _ = ports
    patient = RetryPolicy(retries=200, max_delay=0.5)
    models = [TritonRemoteModel(f"grpc://127.0.0.1:{grpc_port}/scale", retries=patient),
              TritonRemoteModel(f"http://127.0.0.1:{http_port}/scale", retries=patient)]
    x = np.arange(FEATURES, dtype=np.float32)

    def call_all_while(start_server) -> list[dict]:
        results: list = [None] * len(models)
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, models[i](x)))
                   for i in range(len(models))]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # the first attempts are refused
        start_server()
        for thread in threads:
            thread.join(120)
        return results

    caplog.set_level(logging.INFO, logger="builder.client.retry")
    # Triton waits up to --exit-timeout-secs for idle keep-alive HTTP connections to go
    server = TritonServer(root, ports=tuple(ports), exit_timeout=2)
    try:
        for result in call_all_while(server.start):
            np.testing.assert_array_equal(result["Y"], expected_scale(x))
        for scheme in SCHEMES:
            assert any(f" {scheme}://" in r.getMessage() for r in caplog.records), scheme

        server.stop()
        caplog.clear()
        for result in call_all_while(server.start):
            np.testing.assert_array_equal(result["Y"], expected_scale(x))
        assert caplog.records, "the restart was not noticed"

        # closing lets the server shut down at once: no keep-alive connection is left behind
        models[1].batch([x] * 8)  # several threads, several HTTP connections
        asyncio.run(_async_call(f"http://127.0.0.1:{http_port}/scale", x))
        for model in models:
            model.close()
        server.stop()
        assert len(_open_http_connections_at_exit(server.logs())) <= 1, server.logs()[-2000:]
    finally:
        for model in models:
            model.close()
        server.close()


def _open_http_connections_at_exit(log: str) -> list[int]:
    """Triton's once-a-second count of open HTTP connections while it stops, non-zero ones only.

    The first count may still hold a connection the client has just closed (the server has not
    read its end yet); a connection left open shows up again a second later.
    """
    counts = re.findall(r"Timeout \d+: Found (\d+) HTTP service connections", log)
    return [int(count) for count in counts if int(count)]


async def _async_call(model_url: str, x: np.ndarray) -> None:
    async with AsyncTritonRemoteModel(model_url) as model:
        await model.batch([x] * 4)

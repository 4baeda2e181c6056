"""Verification refuses an image whose repository API a client without the key could use.

Against a real host Triton 2.51 on an empty repository, in the three ways a server can be
started: explicit model control and nothing restricted (how images ran before they were
locked: any client could load code — refused), the same with the image's restrictions (locked),
and without explicit model control (closed: the releases that cannot restrict APIs).
"""

from __future__ import annotations

import pytest

from builder.runtime.supervisor import locked_command
from builder.verify.container import ContainerEndpoint
from builder.verify.verification import VerificationError, _check_repository_api_closed


def _endpoint(server) -> ContainerEndpoint:
    return ContainerEndpoint(http_url=server.http_url, grpc_url=server.grpc_url,
                             metrics_url="", container_id="host")


@pytest.mark.parametrize("flags, closed", [
    (["--model-control-mode=explicit"], False),
    (locked_command(["--model-control-mode=explicit"], "k" * 32), True),
    (["--model-control-mode=none"], True),
])
def test_only_a_locked_or_closed_repository_api_passes(triton_server, tmp_path, flags, closed):
    (tmp_path / "models").mkdir()
    server = triton_server(tmp_path / "models", extra_args=tuple(flags))
    if closed:
        _check_repository_api_closed(_endpoint(server))
    else:
        with pytest.raises(VerificationError, match="answers a client without the key"):
            _check_repository_api_closed(_endpoint(server))

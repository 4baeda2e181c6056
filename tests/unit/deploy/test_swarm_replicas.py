"""The replicas of a stack, read while the engine removes one of them (swarm replaces a dead
task's container at any moment): the one removed between the engine's list and its inspection
is left out, and the rest are read. Plain containers with a swarm service's label stand for the
tasks; the removal is real, done just before the SDK inspects that container."""

from __future__ import annotations

import uuid

from builder.deploy.swarm import SERVICE, replicas
from builder.engine.container_lifecycle import create_container, remove_container


def test_a_replica_removed_while_they_are_listed_is_left_out(docker_client, os_image,
                                                            monkeypatch):
    stack = f"tb-replicas-{uuid.uuid4().hex[:8]}"
    label = {"com.docker.swarm.service.name": f"{stack}_{SERVICE}"}
    kept, gone = (create_container(docker_client, os_image, owner=None, start=True,
                                   command=["sleep", "60"], labels=label) for _ in range(2))
    inspect = docker_client.api.inspect_container

    def inspect_after_removal(container, *args, **kwargs):
        if container == gone.id:
            remove_container(docker_client, gone.id)
        return inspect(container, *args, **kwargs)

    monkeypatch.setattr(docker_client.api, "inspect_container", inspect_after_removal)
    try:
        assert [replica.container_id for replica in replicas(docker_client, stack)] == [kept.id]
    finally:
        remove_container(docker_client, kept.id)
        remove_container(docker_client, gone.id)

"""Where containers reach the build: the bridge's gateway, also on a fresh engine whose bridge
lists its subnet alone (Docker 20.10 on a new machine: CI at 053fbdb failed there)."""

from __future__ import annotations

import ipaddress
import subprocess

import docker
import pytest

from builder.verify.weights_source import WeightsSourceError, bridge_gateway


class _Networks:
    def __init__(self, ipam: dict) -> None:
        self.ipam = ipam

    def get(self, name: str):
        if self.ipam is None:
            raise docker.errors.NotFound(f"network {name} not found")
        return type("Network", (), {"attrs": {"IPAM": self.ipam}})()


class _Engine:
    def __init__(self, ipam: dict | None) -> None:
        self.networks = _Networks(ipam)


def test_the_gateway_is_the_configured_one_else_the_subnets_first_address():
    assert bridge_gateway(_Engine({"Config": [{"Subnet": "172.18.0.0/16",
                                               "Gateway": "172.18.0.254"}]})) == "172.18.0.254"
    assert bridge_gateway(_Engine({"Config": [{"Subnet": "172.17.0.0/16"}]})) == "172.17.0.1"
    assert bridge_gateway(_Engine({"Config": [{"Subnet": "fd00::/64"},
                                              {"Subnet": "10.9.0.0/24"}]})) == "10.9.0.1"
    for ipam in (None, {"Config": []}, {"Config": [{"Subnet": "fd00::/64"}]}):
        with pytest.raises(WeightsSourceError, match="no default bridge network"):
            bridge_gateway(_Engine(ipam))


def test_the_engines_bridge_gateway_is_an_address_of_this_host(docker_client):
    gateway = bridge_gateway(docker_client)
    addresses = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                               text=True, check=True).stdout
    assert ipaddress.ip_address(gateway) and f" {gateway}/" in addresses, (gateway, addresses)

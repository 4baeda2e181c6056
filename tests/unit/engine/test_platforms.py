"""Platform names: every tool's name for a platform from one table, and bad ones refused."""

from __future__ import annotations

import pytest

from builder.engine.platforms import (
    AMD64,
    ARM64,
    DEFAULT_PLATFORM,
    UnknownPlatformError,
    image_platform_name,
    parse_platform,
    parse_platforms,
    platform_of_machine,
    platform_option,
    platform_references,
)


@pytest.mark.parametrize("text", ["linux/s390x", "linux/arm", "windows/amd64", "arm64", ""])
def test_an_unknown_platform_is_refused_naming_it_and_the_supported_ones(text):
    with pytest.raises(UnknownPlatformError) as refused:
        parse_platforms(["linux/amd64", text])
    assert repr(text) in str(refused.value)
    assert "linux/amd64, linux/arm64" in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_the_engines_and_unames_spellings_name_the_same_platforms():
    assert parse_platform("linux/arm64/v8") is ARM64
    assert parse_platform("Linux/AArch64") is ARM64
    assert parse_platform("linux/x86_64") is AMD64
    assert platform_of_machine("aarch64") is ARM64 and platform_of_machine("amd64") is AMD64
    assert platform_of_machine("riscv64") is None


def test_platforms_are_kept_once_in_order_and_default_to_amd64():
    assert parse_platforms(["linux/arm64", "linux/amd64", "linux/arm64/v8"]) == (ARM64, AMD64)
    assert parse_platforms(None) == (DEFAULT_PLATFORM,) == (AMD64,)


def test_each_tool_gets_its_own_name():
    assert (ARM64.architecture, ARM64.variant, ARM64.machine, ARM64.debian, ARM64.binfmt) == (
        "arm64", "v8", "aarch64", "arm64", "qemu-aarch64")
    assert ARM64.index_entry() == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    assert AMD64.index_entry() == {"architecture": "amd64", "os": "linux"}


def test_per_platform_references_keep_the_registry_and_repository():
    assert platform_references(["localhost:5000/team/embed:1", "embed"], ARM64) == [
        "localhost:5000/team/embed:1-arm64", "embed:latest-arm64"]


def test_only_another_platform_is_named_to_the_engine_and_an_image_says_its_own():
    assert platform_option(ARM64) == "linux/arm64"
    assert platform_option(AMD64) is None and platform_option(None) is None
    arm64_image = {"Os": "linux", "Architecture": "arm64"}
    assert ARM64.matches(arm64_image) and not AMD64.matches(arm64_image)
    assert image_platform_name(arm64_image) == "linux/arm64"

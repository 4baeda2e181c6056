"""Emulation: what binfmt_misc must hold for another platform's containers to run, and what the
refusal says — read from directories laid out as the kernel lays out /proc/sys/fs/binfmt_misc."""

from __future__ import annotations

from pathlib import Path

from builder.engine.emulation import binfmt_problem
from builder.engine.platforms import ARM64

REGISTERED = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: {flags}
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""
"""/proc/sys/fs/binfmt_misc/qemu-aarch64 as Debian 12's qemu-user-static registers it."""


def _binfmt_misc(root: Path, handler: str | None) -> Path:
    root.mkdir()
    (root / "status").write_text("enabled\n")
    if handler is not None:
        (root / "qemu-aarch64").write_text(handler)
    return root


def test_an_unmounted_binfmt_misc_is_named_with_the_commands_that_fix_it(tmp_path):
    problem = binfmt_problem(ARM64, tmp_path / "binfmt_misc")
    assert "is not mounted" in problem
    assert "apt-get install qemu-user-static binfmt-support" in problem
    assert "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc" in problem
    assert "update-binfmts --enable qemu-aarch64" in problem


def test_no_handler_registered(tmp_path):
    problem = binfmt_problem(ARM64, _binfmt_misc(tmp_path / "b", None))
    assert "no emulator for linux/arm64 is registered" in problem
    assert "apt-get install qemu-user-static binfmt-support" in problem


def test_a_disabled_handler(tmp_path):
    root = _binfmt_misc(tmp_path / "b", REGISTERED.format(flags="PF").replace("enabled",
                                                                               "disabled"))
    assert "disabled: update-binfmts --enable qemu-aarch64" in binfmt_problem(ARM64, root)


def test_a_handler_without_the_fix_binary_flag_cannot_serve_containers(tmp_path):
    root = _binfmt_misc(tmp_path / "b", REGISTERED.format(flags="P"))
    assert "lacks the F flag" in binfmt_problem(ARM64, root)


def test_qemu_user_static_handler_is_enough(tmp_path):
    assert binfmt_problem(ARM64, _binfmt_misc(tmp_path / "b", REGISTERED.format(flags="PF"))) \
        is None

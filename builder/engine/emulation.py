"""Whether the engine can run another platform's containers: the kernel's binfmt_misc handler
for the platform's machine code, registered with the ``F`` (fix binary) flag.

A build for a platform that is not the engine's own runs that platform's programs four times:
making its Debian OS image (``mmdebstrap``'s maintainer scripts), the ``RUN`` steps of its CPU
base, the environment (the target's own ``python3`` makes the venv) and the verification
(Triton itself). Where the host has no emulator for that machine code each of those fails with
``exec format error`` minutes into the build, so the build checks first and refuses before
anything is pulled, built or written, saying how to enable it.

The check reads ``/proc/sys/fs/binfmt_misc/<name>`` (Debian's ``qemu-user-static`` registers
``qemu-aarch64`` there through ``binfmt-support``): the handler must be enabled and carry the
``F`` flag, which opens the emulator when it is registered, so containers need no qemu inside
(binfmt_misc(5) of the kernel's admin guide). An engine that is not on this machine
(``DOCKER_HOST`` names another host) cannot be read from here: its own platform is known from
``docker info``, and emulation there is assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from builder.engine.daemon import EngineError, configured_host
from builder.engine.platforms import Platform, platform_of_machine

BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
ENABLE_EMULATION = (
    "apt-get install qemu-user-static binfmt-support; "
    "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc (where it is not mounted); "
    "update-binfmts --enable {binfmt}")
"""How to enable emulation on a Debian or Ubuntu host (as root), for a platform's binfmt name."""


class EmulationMissingError(EngineError):
    """The engine cannot run a target platform's programs: the build is refused before it
    starts (the machine lacks something, as the CLI's exit code 3 says)."""


@dataclass(frozen=True)
class PlatformSupport:
    """How the engine runs one target platform's containers."""

    platform: Platform
    native: bool
    """The engine's own platform: no emulation."""
    problem: str | None = None
    """Why it cannot (None: it can)."""

    @property
    def emulated(self) -> bool:
        return not self.native and self.problem is None


def engine_platform(client: docker.DockerClient) -> Platform | None:
    """The engine's own platform, from ``docker info``'s ``Architecture`` (``x86_64``)."""
    try:
        machine = client.info().get("Architecture", "")
    except docker.errors.APIError as error:
        raise EngineError(f"the engine did not say which machine it runs on: {error}") from error
    return platform_of_machine(machine)


def platform_support(client: docker.DockerClient, target: Platform, *,
                     binfmt_misc: Path | None = None) -> PlatformSupport:
    """Whether (and how) the engine runs ``target``'s containers (``binfmt_misc``: where the
    kernel's handlers are listed, :data:`BINFMT_MISC`)."""
    if engine_platform(client) == target:
        return PlatformSupport(target, native=True)
    host = configured_host()
    if host is not None and not host.startswith("unix://"):
        return PlatformSupport(target, native=False)
    return PlatformSupport(target, native=False,
                           problem=binfmt_problem(target, binfmt_misc or BINFMT_MISC))


def binfmt_problem(target: Platform, binfmt_misc: Path | None = None) -> str | None:
    """Why this host's kernel cannot run ``target``'s machine code in containers (None: it
    can), with the commands that fix it."""
    fix = ENABLE_EMULATION.format(binfmt=target.binfmt)
    binfmt_misc = binfmt_misc or BINFMT_MISC
    if not (binfmt_misc / "status").exists():
        return (f"{binfmt_misc} is not mounted, so this host runs no {target} program: "
                f"enable emulation ({fix})")
    handler = binfmt_misc / target.binfmt
    if not handler.exists():
        return (f"no emulator for {target} is registered ({handler} does not exist): "
                f"enable emulation ({fix})")
    lines = handler.read_text().splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"the emulator {handler} is registered but disabled: update-binfmts --enable " \
               f"{target.binfmt}"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")),
                 "")
    if "F" not in flags:
        return (f"the emulator {handler} lacks the F flag (flags: {flags or 'none'}), so "
                f"containers, which do not hold the emulator, cannot run {target} programs: "
                f"install qemu-user-static (its handlers carry F) and update-binfmts --enable "
                f"{target.binfmt}")
    return None


def require_platforms(client: docker.DockerClient,
                      targets: tuple[Platform, ...]) -> dict[Platform, PlatformSupport]:
    """Each target's support; :class:`EmulationMissingError` naming every platform the engine
    cannot run, before anything is built."""
    support = {target: platform_support(client, target) for target in targets}
    missing = [s for s in support.values() if s.problem]
    if missing:
        raise EmulationMissingError(
            "; ".join(f"cannot build for {s.platform}: {s.problem}" for s in missing)
            + ". Building for another platform runs its programs (its base image's steps, the "
              "environment's installer, the verification) under emulation; or build on a "
              f"{'/'.join(s.platform.machine for s in missing)} machine")
    return support

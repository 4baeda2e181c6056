"""Time the README's test command as CI meets it on a new machine, on a machine that is not new.

Why: after one run a machine keeps what the run installed (Debian's packages, the engine and its
images, pip's and the builder's caches), and emptying the engine does not make it new again:
CI on a new machine took much longer than such "fresh" runs said. The honest stand-in is a
privileged container (:data:`PRIVILEGES`) of the project's own Debian OS image with what a new
machine of this kind has before anything is installed (``tests/images/new-machine.Dockerfile``;
the machine's Python, wheel directories, package indexes and pip configuration from the host)
and its own ``dockerd`` inside, on an empty data directory: the test bed installs and starts
everything else there, as on a new machine.

    python -m tests.support.new_machine [--commit REV] [--log build/new-machine.log]

clones ``REV`` (default ``HEAD``) of this checkout inside, with ``../shared`` beside it
read-only, runs ``bash .ci/run`` as CI does (``CI=true``, no standard input) and prints its
exit status and minutes; the run's unit durations and timeline come back beside the log
(``new-machine.unit_durations*.json``). The host's own engine runs the stand-in and nothing
else meanwhile: a figure taken while the machine is busy is not one. The host's ``qemu-aarch64``
registration is withdrawn first (the kernel's is shared with the container), so the test
bed inside enables emulation as a new machine's does.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.paths import IMAGES, REPO_ROOT

TAG = "triton-builder-test/new-machine:1"
NAME = "triton-builder-new-machine"
PYTHON = Path(sys.base_prefix)
"""The machine's own CPython (pyenv's on this kind), copied in writable at the same path; the
machine's other Pythons beside it (pyenv's ``versions/``: a test packs a Python 3.12 venv)
read-only."""
READ_ONLY = ["/opt/wheels", "/opt/pypi", "/opt/pypi-more", "/etc/pip.conf", "/etc/xdg/pip",
             "/root/.config/pip"]
"""What a new machine has for pip: a torch wheel, local package indexes, their configuration."""
ENVIRONMENT_PREFIXES = ("PIP_", "SSL_CERT", "REQUESTS_CA", "CURL_CA", "GIT_SSL", "GRPC_DEFAULT")
"""The machine's variables CI keeps (pip's settings, where the CA bundle is)."""
WORK = Path("/var/lib/triton-builder-new-machine")
"""On the host, emptied before each run: ``docker/``, the stand-in's ``/var/lib/docker`` (overlay2
cannot stack on the container's own overlay), and ``python/``, the writable copy of
:data:`PYTHON`."""
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PRIVILEGES = ["--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt",
              "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--security-opt",
              "systempaths=unconfined", "--device-cgroup-rule", "a *:* rwm"]
"""What ``--privileged`` would give, less ``CAP_SYS_RESOURCE``, which this machine's own
bounding set lacks (``--privileged`` asks for it, and the engine refuses to start the
container): an engine inside, ``/proc/sys`` writable (``binfmt_misc``, IP forwarding)."""
NETWORK = ["--sysctl", "net.ipv6.conf.all.disable_ipv6=0",
           "--sysctl", "net.ipv6.conf.lo.disable_ipv6=0"]
"""IPv6 on the loopback, as the machine has it (Docker turns it off in a container: a client
test's ``[::1]`` then fails with EADDRNOTAVAIL instead of a refused connection)."""
BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")


def stand_in_image(client) -> str:
    """The stand-in's image, built on the project's OS image unless the engine has it."""
    import docker.errors

    from builder.base.os_image import debian_os_image
    from builder.engine.image_build import build_image

    try:
        client.images.get(TAG)
        return TAG
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="new-machine-") as workdir:
        context = Path(workdir)
        shutil.copyfile(IMAGES / "new-machine.Dockerfile", context / "Dockerfile")
        shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", context / "ca-certificates.crt")
        shutil.copy2(shutil.which("docker"), context / "docker")
        build_image(client, context, [TAG], buildargs={"BASE": debian_os_image(client)})
    return TAG


def _script(commit: str) -> str:
    """What runs inside: the clone, CI's command, timed, and the run's records brought out."""
    return "\n".join([
        "set -eu",
        "git config --global --add safe.directory '*'",
        "mkdir -p /work && cp -a /seed/shared /work/shared && chmod -R a-w /work/shared",
        "git clone -q /seed/repository /work/main && cd /work/main",
        f"git checkout -q {commit}",
        "started=$(date +%s)",
        "set +e; CI=true bash .ci/run < /dev/null; status=$?; set -e",
        'echo "new machine: .ci/run exited $status after $(( $(date +%s) - started )) s"',
        "for record in build/unit_durations*.json; do",
        '  cp "$record" "/out/new-machine.${record#build/}"; done',
        "exit $status",
    ])


def run(commit: str, log: Path) -> int:
    from builder.engine import ensure_engine

    client = ensure_engine()
    image = stand_in_image(client)
    resolved = subprocess.run(["git", "rev-parse", commit], cwd=REPO_ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    if BINFMT.exists():
        BINFMT.write_text("-1")
    subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "docker").mkdir(parents=True)
    subprocess.run(["cp", "-a", str(PYTHON), str(WORK / "python")], check=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    mounts = ["/sys/fs/cgroup:/sys/fs/cgroup:rw", f"{REPO_ROOT}:/seed/repository:ro",
              f"{REPO_ROOT.parent / 'shared'}:/seed/shared:ro",
              f"{WORK / 'docker'}:/var/lib/docker", f"{log.parent.resolve()}:/out"]
    if PYTHON.parent.name == "versions":
        mounts.append(f"{PYTHON.parents[1]}:{PYTHON.parents[1]}:ro")
    mounts.append(f"{WORK / 'python'}:{PYTHON}")
    mounts += [f"{path}:{path}:ro" for path in READ_ONLY if os.path.exists(path)]
    environment = {name: value for name, value in os.environ.items()
                   if name.startswith(ENVIRONMENT_PREFIXES)}
    environment["PATH"] = f"{PYTHON}/bin:{SYSTEM_PATH}"
    command = ["docker", "run", "--name", NAME, "--hostname", "new-machine", *PRIVILEGES, *NETWORK,
               "--shm-size", f"{shutil.disk_usage('/dev/shm').total}b",
               "--ulimit", "nofile={}:{}".format(*resource.getrlimit(resource.RLIMIT_NOFILE))]
    for mount in mounts:
        command += ["-v", mount]
    for name, value in environment.items():
        command += ["-e", f"{name}={value}"]
    command += [image, "bash", "-c", _script(resolved)]
    started = time.monotonic()
    with open(log, "w") as stream:
        status = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
    minutes = (time.monotonic() - started) / 60
    subprocess.run(["docker", "rm", "-f", NAME], capture_output=True)
    shutil.rmtree(WORK, ignore_errors=True)
    print(f"{resolved[:7]} on a new machine's stand-in: exit {status} in {minutes:.1f} min "
          f"(the log: {log})")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--log", type=Path, default=REPO_ROOT / "build" / "new-machine.log")
    args = parser.parse_args(argv)
    return run(args.commit, args.log)


if __name__ == "__main__":
    sys.exit(main())

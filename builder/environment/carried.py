"""The bridged environment: packages plus the interpreter that runs them, in one tarball.

When the release's Python is not the builder's, the image has no interpreter the pipeline could
load in; the environment brings it. :class:`CarriedInterpreterPacker` takes it from an
*interpreter image* (a target from :func:`builder.environment.target.interpreter_target`, whose
glibc the release's is not older than): a container of that image copies its own Python into a
relocatable prefix (:mod:`builder.bridge.interpreter_copy`), and that Python installs the
wheels fetched on this host into the prefix's ``site-packages``. The prefix's ``lib/`` is what the
python backend puts on the stub's ``LD_LIBRARY_PATH``, so ``libpythonX.Y`` and the shared
libraries the bridged stub itself needs (``libraries``) go there.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from builder.bridge.interpreter import COPY_SCRIPT
from builder.environment.errors import PackError, TargetError
from builder.environment.index import PackageIndex
from builder.environment.lock import hash_lock
from builder.environment.packers import (
    RAW_ARCHIVE_NAME,
    Log,
    PackResult,
    fetch_wheels,
    pip_wheel,
)
from builder.environment.portable_scripts import make_scripts_portable
from builder.environment.spec import EnvironmentSpec
from builder.environment.target import EnvironmentTarget


class CarriedInterpreterPacker:
    """Packages and the target image's own Python, packed as one relocatable prefix."""

    name = "interpreter"

    def __init__(self, libraries: Sequence[str | Path] = ()) -> None:
        self.libraries = tuple(Path(library) for library in libraries)

    def fingerprint(self) -> str:
        digest = hashlib.sha256(COPY_SCRIPT.read_bytes())
        for library in sorted(self.libraries):
            digest.update(library.name.encode())
            digest.update(hashlib.sha256(library.read_bytes()).digest())
        return digest.hexdigest()

    def describe(self, spec: EnvironmentSpec) -> str:
        return (f"the environment (with its own interpreter) packed from "
                f"{', '.join(spec.sources()) or 'an empty spec'}")

    def pack(self, spec: EnvironmentSpec, target: EnvironmentTarget, workdir: Path, *,
             index: PackageIndex, on_log: Log) -> PackResult:
        workdir = workdir.resolve()
        version = target.python_version
        requirements, constraints, wheels = fetch_wheels(spec, target, workdir, index, on_log)
        prefix, lock = workdir / "env", workdir / "lock.txt"
        shutil.copyfile(COPY_SCRIPT, workdir / COPY_SCRIPT.name)
        python = str(prefix / "bin" / f"python{version}")
        site = str(prefix / "lib" / f"python{version}" / "site-packages")
        pip = str(pip_wheel(wheels) / "pip")
        copy = ["python3", str(workdir / COPY_SCRIPT.name), str(prefix)]
        install = [python, pip, "install", "--no-index", "--find-links", str(wheels),
                   "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                   "--no-warn-script-location", "--target", site,
                   "-r", str(requirements), "-c", str(constraints)]
        freeze = [python, pip, "freeze", "--all", "--disable-pip-version-check", "--path", site]
        script = (f"set -e; {shlex.join(copy)} > {shlex.quote(str(workdir / 'copied.json'))}"
                  f" && {shlex.join(install)} && {shlex.join(freeze)} > "
                  f"{shlex.quote(str(lock))}")
        on_log(f"copying Python {version} out of {target.where} and installing the packages")
        try:
            target.run(["/bin/sh", "-c", script], what="copy the interpreter and install the "
                       "packages", binds=[workdir],
                       env={"HOME": "/tmp", "PIP_CONFIG_FILE": "/dev/null"})
        except TargetError as error:
            raise PackError(str(error)) from error
        for library in self.libraries:
            shutil.copy2(library, prefix / "lib" / library.name)
        make_scripts_portable(Path(site), prefix)
        raw = workdir / RAW_ARCHIVE_NAME
        on_log(f"packing {prefix}")
        with tarfile.open(raw, "w") as packed:
            for path in sorted(prefix.rglob("*")):
                packed.add(path, arcname=str(path.relative_to(prefix)), recursive=False)
        header = (f"# interpreter: Python {target.full_python_version} from {target.where}\n"
                  + "".join(f"# with {library.name} (the bridged stub's)\n"
                            for library in self.libraries))
        return PackResult(archive=raw, lock=header + hash_lock(lock.read_text(), wheels))

"""The image's bill of materials: what a serving image ships, as a CycloneDX 1.6 JSON document.

Every serving image carries it at :data:`SBOM_PATH`, named by the ``ai.triton-builder.sbom``
label (:mod:`builder.image.labels`), and ``triton-builder inspect IMAGE --sbom`` prints it. It
lists, each as a component:

* the environment's packages, from its lock (:mod:`builder.environment.lock`): name, version,
  the sha256 of the wheel each was installed from, ``pkg:pypi/…`` (conda's: ``pkg:conda/…``);
* the python backend stub the python models run on — the release's own, one from an
  ``nvidia-pytriton`` wheel, or compiled from the release's python_backend branch — with the
  sha256 of the file where the image carries its own, and the interpreter a bridged environment
  carries (:mod:`builder.bridge`);
* Triton (the release), the base image (reference, registry digest where it came from one, image
  ID) and the OS image below our CPU base where its labels name one;
* the OS packages the base lists (dpkg: :mod:`builder.image.os_packages`), ``pkg:deb/…``.

The document is written with ``cyclonedx-python-lib`` and is a pure function of those inputs:
components are sorted by the library, every ``bom-ref`` is given (never a random one), there is
no timestamp (optional in CycloneDX), and the serial number is a UUID derived from the content.
So identical inputs give identical bytes, and the file is part of the image's content hash.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from builder.base.releases import Release, StubSource
from builder.bridge.routes import StubRoute
from builder.environment.attach import LOCK_FILE, STUB_FILE
from builder.environment.lock import LockedPackage, read_lock
from builder.environment.target import IMAGE_STUB
from builder.image.context import ContextPlan, environment_image_path, file_digest
from builder.image.os_packages import OsPackages
from builder.tritonserver.wheel import PYTRITON_REQUIREMENT

SBOM_PATH = "/opt/triton-builder/sbom.cdx.json"
PROPERTY = "triton-builder:"
"""The namespace of our CycloneDX properties."""
_SERIAL_NAMESPACE = uuid.UUID("6f1c2f43-5a0e-5b7e-9a53-1d0c6b9f2c11")
_OCI_BASE_NAME = "org.opencontainers.image.base.name"
_OCI_BASE_DIGEST = "org.opencontainers.image.base.digest"


@dataclass(frozen=True)
class PythonRuntime:
    """How the image's python models run, as the build chose it (for the bill of materials)."""

    stub: StubRoute
    python_version: str
    """The environment's full Python version (``3.11.2``)."""
    interpreter_image: str | None = None
    """Bridged: the image the environment's interpreter was copied from."""
    interpreter_image_id: str | None = None


@dataclass(frozen=True)
class BaseImage:
    """The image a serving image is built FROM."""

    reference: str
    image_id: str
    digest: str
    """The registry digest where it came from a registry, else the image ID."""
    labels: Mapping[str, str]


@dataclass(frozen=True)
class ShippedEnvironment:
    """A packed environment of the image, as its lock names it."""

    location: str
    """Where its lock lies in the image (an explicit tarball: where the tarball lies)."""
    packages: tuple[LockedPackage, ...]


@dataclass(frozen=True)
class ShippedStub:
    """A python backend stub the model repository carries (one file, linked from other models)."""

    paths: tuple[str, ...]
    sha256: tuple[str, ...]
    """Of each distinct file (one, unless links were replaced by copies that differ)."""


def shipped_environments(plan: ContextPlan,
                         explicit: Iterable[str | os.PathLike] = ()) -> list[ShippedEnvironment]:
    """The locks of the model repository's environments, and those beside ``explicit`` tarballs
    (the cache keeps ``environment.lock.txt`` beside ``environment.tar.gz``)."""
    found = []
    for entry in plan.entries:
        if PurePosixPath(entry.path).name == LOCK_FILE and entry.source is not None:
            found.append(ShippedEnvironment(_image_path(plan, entry.path),
                                            read_lock(entry.source.read_text())))
    for tarball in explicit:
        lock = Path(tarball).with_name(LOCK_FILE)
        if lock.is_file():
            found.append(ShippedEnvironment(environment_image_path(tarball),
                                            read_lock(lock.read_text())))
    return found


def shipped_stub(plan: ContextPlan) -> ShippedStub | None:
    """The stub the repository carries (bridged, or compiled on request), if any."""
    paths, digests = [], set()
    for entry in plan.entries:
        if PurePosixPath(entry.path).name == STUB_FILE:
            paths.append(_image_path(plan, entry.path))
            if entry.source is not None:
                digests.add(file_digest(entry.source))
    if not digests:
        return None
    return ShippedStub(tuple(sorted(paths)), tuple(sorted(digests)))


def image_sbom(
    *,
    title: str,
    version: str,
    release: Release,
    base: BaseImage,
    os_packages: OsPackages | None,
    environments: Sequence[ShippedEnvironment],
    stub: ShippedStub | None = None,
    runtime: PythonRuntime | None = None,
) -> str:
    """The CycloneDX 1.6 JSON text of the image ``title``:``version`` (see the module's text)."""
    image = Component(name=title, version=version, type=ComponentType.CONTAINER,
                      bom_ref="image",
                      description=f"serving image for {release.platform} on "
                                  f"{release.describe()}",
                      properties=[Property(name=PROPERTY + "platform", value=release.platform.name),
                                  Property(name=PROPERTY + "architecture",
                                           value=release.platform.architecture)])
    bom = Bom(serial_number=uuid.UUID(int=0))
    bom.metadata.timestamp = None  # optional, and it would make two identical builds differ
    bom.metadata.component = image
    for tool, tool_version in sorted(_tools().items()):
        bom.metadata.tools.components.add(
            Component(name=tool, version=tool_version, type=ComponentType.APPLICATION,
                      bom_ref=f"tool:{tool}"))
    parts = [_triton(release), _base(base, os_packages), _stub(release, stub, runtime)]
    if runtime is not None and runtime.interpreter_image:
        parts.append(_interpreter(runtime))
    parts += _environment_packages(environments)
    if os_packages is not None:
        parts += _os_packages(os_packages)
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(image, parts)
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    bom.serial_number = uuid.uuid5(_SERIAL_NAMESPACE, hashlib.sha256(text.encode()).hexdigest())
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def sbom_packages(document: str | Mapping) -> dict[str, dict[str, str]]:
    """``{purl: {"name", "version"}}`` of every component of an SBOM (for checks and tools)."""
    data = json.loads(document) if isinstance(document, str) else document
    return {component["purl"]: {"name": component["name"], "version": component.get("version")}
            for component in data.get("components", []) if "purl" in component}


def _triton(release: Release) -> Component:
    properties = [Property(name=PROPERTY + "release", value=release.release),
                  Property(name=PROPERTY + "cuda", value=release.cuda or "cpu"),
                  Property(name=PROPERTY + "python", value=release.python_version)]
    if not release.ngc:
        properties.append(Property(name=PROPERTY + "from", value=PYTRITON_REQUIREMENT))
    return Component(name="tritonserver", group="nvidia", version=release.triton_version,
                     type=ComponentType.APPLICATION, bom_ref="triton",
                     description=release.describe(), properties=properties)


def _base(base: BaseImage, os_packages: OsPackages | None) -> Component:
    reference, _, tag = base.reference.rpartition(":")
    if "/" in tag or not reference:
        reference, tag = base.reference, ""
    purl = None
    if base.digest != base.image_id:  # a registry digest: the image can be pulled by it
        qualifiers = {"repository_url": reference, **({"tag": tag} if tag else {})}
        purl = PackageURL("oci", name=reference.rsplit("/", 1)[-1], version=base.digest,
                          qualifiers=qualifiers)
    properties = [Property(name=PROPERTY + "image-id", value=base.image_id)]
    if os_packages is not None and os_packages.distribution:
        properties.append(Property(name=PROPERTY + "distribution", value=(
            f"{os_packages.distribution} {os_packages.distribution_version}".strip())))
    elif os_packages is None:
        properties.append(Property(name=PROPERTY + "os-packages",
                                   value="not listed: the image has no dpkg status"))
    for key, name in ((_OCI_BASE_NAME, "base.name"), (_OCI_BASE_DIGEST, "base.digest")):
        if base.labels.get(key):
            properties.append(Property(name=PROPERTY + name, value=base.labels[key]))
    return Component(name=base.reference, version=base.digest, type=ComponentType.CONTAINER,
                     bom_ref="base-image", purl=purl, properties=properties,
                     description="the image the serving image is built FROM")


def _stub(release: Release, stub: ShippedStub | None, runtime: PythonRuntime | None) -> Component:
    route = runtime.stub if runtime is not None else None
    if stub is None:
        route = route or StubRoute(StubSource.RELEASE, "the release's own stub")
        paths: tuple[str, ...] = (IMAGE_STUB,)
    else:
        paths = stub.paths
    description = route.description if route else "a stub the model repository carries"
    if route is not None and route.kind is StubSource.RELEASE and not release.ngc:
        base = "slim GPU" if release.slim else "CPU"
        description += f" (the {base} base's, from {PYTRITON_REQUIREMENT})"
    compiled = route if route is not None and route.kind is StubSource.COMPILE else None
    version = compiled.branch if compiled and compiled.branch else release.triton_version
    properties = [Property(name=PROPERTY + "stub-route",
                           value=StubSource(route.kind).value if route else "unknown")]
    properties += [Property(name=PROPERTY + "path", value=path) for path in paths]
    if route is not None and route.requirement:
        properties.append(Property(name=PROPERTY + "from", value=route.requirement))
    if compiled is not None:
        properties.append(Property(name=PROPERTY + "from",
                                   value=f"python_backend {compiled.branch}"))
    if runtime is not None:
        properties.append(Property(name=PROPERTY + "python", value=runtime.python_version))
    hashes = [HashType(alg=HashAlgorithm.SHA_256, content=digest)
              for digest in (stub.sha256 if stub else ())]
    return Component(name="triton_python_backend_stub", version=version,
                     type=ComponentType.APPLICATION, bom_ref="python-backend-stub",
                     description=description, hashes=hashes, properties=properties)


def _interpreter(runtime: PythonRuntime) -> Component:
    properties = [Property(name=PROPERTY + "from", value=str(runtime.interpreter_image))]
    if runtime.interpreter_image_id:
        properties.append(Property(name=PROPERTY + "image-id", value=runtime.interpreter_image_id))
    return Component(name="python", version=runtime.python_version,
                     type=ComponentType.APPLICATION, bom_ref="carried-interpreter",
                     description=f"CPython {runtime.python_version}, carried in the environment "
                                 f"(copied from {runtime.interpreter_image})",
                     properties=properties)


def _environment_packages(environments: Sequence[ShippedEnvironment]) -> list[Component]:
    where: dict[str, list[str]] = {}
    found: dict[str, LockedPackage] = {}
    for environment in environments:
        for package in environment.packages:
            purl = _package_url(package).to_string()
            found.setdefault(purl, package)
            where.setdefault(purl, []).append(environment.location)
    return [Component(
        name=package.name, version=package.version, type=ComponentType.LIBRARY, bom_ref=purl,
        purl=_package_url(package),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=digest.removeprefix("sha256:"))
                for digest in package.hashes if digest.startswith("sha256:")],
        properties=[Property(name=PROPERTY + "lock", value=path) for path in where[purl]])
        for purl, package in sorted(found.items())]


def _package_url(package: LockedPackage) -> PackageURL:
    if package.ecosystem == "conda":
        qualifiers = {key: value for key, value in (("build", package.build),
                                                    ("channel", package.channel)) if value}
        return PackageURL("conda", name=package.name, version=package.version,
                          qualifiers=qualifiers)
    return PackageURL("pypi", name=package.name, version=package.version)


def _os_packages(listed: OsPackages) -> list[Component]:
    distro = f"{listed.distribution}-{listed.distribution_version}".strip("-")
    components = []
    for package in listed.packages:
        qualifiers = {"arch": package.architecture, **({"distro": distro} if distro else {})}
        purl = PackageURL("deb", namespace=listed.distribution or None, name=package.name,
                          version=package.version, qualifiers=qualifiers)
        properties = ([Property(name=PROPERTY + "source-package", value=package.source)]
                      if package.source else [])
        components.append(Component(
            name=package.name, version=package.version, type=ComponentType.LIBRARY,
            bom_ref=purl.to_string(), purl=purl, properties=properties))
    return components


def _image_path(plan: ContextPlan, context_path: str) -> str:
    """Where a context entry lands in the image (``code/models/x`` → ``/models/x``)."""
    return "/" + context_path.partition("/")[2]


def _tools() -> dict[str, str]:
    tools = {}
    for distribution in ("triton-builder", "cyclonedx-python-lib"):
        try:
            tools[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            tools[distribution] = "unknown"
    return tools

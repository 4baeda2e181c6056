"""What goes into the model environment: spec files and operators' own requirements, merged.

Triton extracts every distinct environment tarball once per server, and a big one takes minutes
(server#5045). So an image gets exactly one environment: every source is merged into one
:class:`EnvironmentSpec`, whose canonical text is both what gets installed and what the cache
key hashes (the order sources come in does not change it).

Sources:

* ``envs/<name>.txt`` — a pip requirements file (``-r other.txt`` includes are followed);
* ``envs/<name>.yml`` — a conda ``environment.yml`` (``channels``, ``dependencies`` with an
  optional ``pip:`` list); any such file makes the environment a conda one;
* an operator's ``requirements`` attribute: a list of pip requirement strings, set by hand or
  with :func:`requires`. :func:`operator_requirements` collects them from a list of operators.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.environment.errors import SpecError

REQUIREMENTS_ATTRIBUTE = "requirements"
"""The attribute an operator declares its pip requirements in: ``op.requirements = ["x>=1"]``."""

_Op = TypeVar("_Op")


@dataclass(frozen=True)
class EnvironmentSpec:
    """One environment's packages: pip requirements, and conda dependencies when it is conda's.

    ``origins`` maps each requirement to where it came from, for messages only: it is left out
    of comparisons and of the cache key.
    """

    requirements: tuple[str, ...] = ()
    conda_dependencies: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    conda: bool = False
    origins: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, hash=False)

    def requirements_text(self) -> str:
        """The pip requirements, one a line, as a ``requirements.txt``."""
        return "".join(f"{line}\n" for line in self.requirements)

    def environment_yml(self, python_version: str) -> str:
        """The conda ``environment.yml`` to create, with Python pinned to ``python_version``.

        A ``python`` dependency that names another minor fails here: the environment's Python
        must be the python backend stub's.
        """
        dependencies: list[object] = [f"python={python_version}"]
        for dependency in self.conda_dependencies:
            if _conda_name(dependency) == "python":
                pinned = _conda_pin(dependency)
                if pinned and pinned != python_version and not pinned.startswith(
                        python_version + "."):
                    raise SpecError(
                        f"the conda spec asks for {dependency!r} ({self.where(dependency)}), but "
                        f"the image's python backend stub runs Python {python_version}: change "
                        f"it to python={python_version} or drop it (it is added for you)"
                    )
            dependencies.append(dependency)
        if self.requirements:
            dependencies.extend(["pip", {"pip": list(self.requirements)}])
        document = {"channels": list(self.channels), "dependencies": dependencies}
        return json.dumps(document, indent=2) + "\n"  # JSON is YAML: no YAML writer needed

    def canonical(self) -> str:
        """The text that identifies this spec (hashed into the cache key)."""
        return json.dumps({
            "conda": self.conda, "channels": list(self.channels),
            "conda_dependencies": list(self.conda_dependencies),
            "requirements": list(self.requirements),
        }, sort_keys=True)

    def sources(self) -> list[str]:
        """Where the requirements came from: spec files and operators, each once."""
        found = (source.rsplit(":", 1)[0] if source.rsplit(":", 1)[-1].isdigit() else source
                 for sources in self.origins.values() for source in sources)
        return list(dict.fromkeys(found))

    def where(self, requirement: str) -> str:
        return ", ".join(self.origins.get(requirement, ())) or "unknown source"


def read_spec(path: str | os.PathLike[str]) -> EnvironmentSpec:
    """Read ``requirements.txt``-style (``.txt``) or conda (``.yml``/``.yaml``) spec ``path``."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"environment spec {path} does not exist")
    if path.suffix in (".yml", ".yaml"):
        return _read_environment_yml(path)
    return _requirements_spec(_read_requirement_lines(path, seen=()), conda=False)


def requirements_spec(requirements: Iterable[str], source: str) -> EnvironmentSpec:
    """A spec holding ``requirements`` (pip requirement strings) that came from ``source``."""
    return _requirements_spec([(line, source) for line in requirements], conda=False)


def requires(*requirements: str) -> Callable[[_Op], _Op]:
    """Declare an operator's pip requirements: ``@requires("tabulate==0.9.0")``."""
    for requirement in requirements:
        _parse(requirement, "@requires")

    def mark(op: _Op) -> _Op:
        setattr(op, REQUIREMENTS_ATTRIBUTE, list(requirements))
        return op

    return mark


def operator_requirements(operators: Iterable[object]) -> EnvironmentSpec:
    """Collect the ``requirements`` that operators declare (callables, partials, instances)."""
    collected: list[tuple[str, str]] = []
    for op in operators:
        declared = _declared(op)
        if declared is None:
            continue
        name = _operator_name(op)
        if isinstance(declared, (str, bytes)) or not isinstance(declared, Iterable):
            raise SpecError(
                f"operator {name}: `requirements` must be a list of pip requirement strings, "
                f"got {declared!r}"
            )
        for requirement in declared:
            if not isinstance(requirement, str):
                raise SpecError(f"operator {name}: requirement {requirement!r} is not a string")
            collected.append((requirement, f"operator {name}"))
    return _requirements_spec(collected, conda=False)


def merge_specs(*specs: EnvironmentSpec) -> EnvironmentSpec:
    """Merge specs into one environment; exact pins of one package that disagree are refused."""
    requirements: dict[str, list[str]] = {}
    conda_dependencies: dict[str, list[str]] = {}
    channels: list[str] = []
    for spec in specs:
        for requirement in spec.requirements:
            requirements.setdefault(requirement, []).extend(spec.origins.get(requirement, ()))
        for dependency in spec.conda_dependencies:
            conda_dependencies.setdefault(dependency, []).extend(spec.origins.get(dependency, ()))
        channels.extend(channel for channel in spec.channels if channel not in channels)
    _refuse_conflicting_pins(requirements)
    origins = {key: tuple(dict.fromkeys(value)) for key, value in
               {**requirements, **conda_dependencies}.items()}
    return EnvironmentSpec(
        requirements=tuple(sorted(requirements, key=_sort_key)),
        conda_dependencies=tuple(sorted(conda_dependencies)),
        channels=tuple(channels),
        conda=any(spec.conda for spec in specs),
        origins=origins,
    )


def missing_requirements(spec: EnvironmentSpec, requirements: Iterable[str]) -> list[str]:
    """Those of ``requirements`` whose package ``spec`` does not name yet (its pin wins)."""
    named = {canonicalize_name(Requirement(line).name) for line in spec.requirements}
    return [line for line in requirements
            if canonicalize_name(Requirement(line).name) not in named]


def load_spec(
    paths: Iterable[str | os.PathLike[str]] = (),
    requirements: Iterable[str] = (),
    operators: Iterable[object] = (),
) -> EnvironmentSpec:
    """The one environment of an image: spec files + extra requirements + operators' own."""
    specs = [read_spec(path) for path in paths]
    requirements = list(requirements)
    if requirements:
        specs.append(requirements_spec(requirements, "build options"))
    specs.append(operator_requirements(operators))
    return merge_specs(*specs)


def _requirements_spec(lines: Iterable[tuple[str, str]], *, conda: bool) -> EnvironmentSpec:
    origins: dict[str, list[str]] = {}
    for line, source in lines:
        origins.setdefault(str(_parse(line, source)), []).append(source)
    merged = {key: tuple(dict.fromkeys(value)) for key, value in origins.items()}
    _refuse_conflicting_pins({key: list(value) for key, value in merged.items()})
    return EnvironmentSpec(requirements=tuple(sorted(merged, key=_sort_key)), conda=conda,
                           origins=merged)


def _read_requirement_lines(path: Path, seen: tuple[Path, ...]) -> list[tuple[str, str]]:
    if path.resolve() in seen:
        raise SpecError(f"{path} includes itself (through -r)")
    seen = (*seen, path.resolve())
    lines: list[tuple[str, str]] = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = _strip_comment(raw)
        if not line:
            continue
        source = f"{path}:{number}"
        option, _, value = line.partition(" ")
        if option in ("-r", "--requirement"):
            lines.extend(_read_requirement_lines(path.parent / value.strip(), seen))
        elif line.startswith("-"):
            raise SpecError(
                f"{source}: {line!r} — options do not belong in an environment spec: give "
                f"package indexes and certificates as build options (PackageIndex), and "
                f"editable installs cannot be packed (build a wheel instead)"
            )
        else:
            lines.append((line, source))
    return lines


def _read_environment_yml(path: Path) -> EnvironmentSpec:
    try:
        import yaml
    except ImportError as error:  # pragma: no cover - PyYAML is a dependency
        raise SpecError(f"reading {path} needs PyYAML (pip install pyyaml)") from error
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SpecError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(document, dict):
        raise SpecError(f"{path}: an environment.yml is a mapping with `dependencies`")
    source = str(path)
    pip_lines: list[tuple[str, str]] = []
    conda_dependencies: dict[str, tuple[str, ...]] = {}
    for item in document.get("dependencies") or []:
        if isinstance(item, str):
            conda_dependencies[" ".join(item.split())] = (source,)
        elif isinstance(item, dict) and set(item) == {"pip"}:
            pip_lines.extend((line, f"{source} (pip)") for line in item["pip"] or [])
        else:
            raise SpecError(f"{path}: cannot read dependency {item!r}")
    pip = _requirements_spec(pip_lines, conda=True)
    channels = tuple(str(channel) for channel in document.get("channels") or [])
    return EnvironmentSpec(
        requirements=pip.requirements, conda_dependencies=tuple(sorted(conda_dependencies)),
        channels=channels, conda=True, origins={**pip.origins, **conda_dependencies},
    )


def _parse(line: str, source: str) -> Requirement:
    try:
        return Requirement(line)
    except InvalidRequirement as error:
        raise SpecError(
            f"{source}: {line!r} is not a pip requirement ({error}); local packages are "
            f"written `name @ file:///absolute/path.whl`"
        ) from error


def _refuse_conflicting_pins(requirements: dict[str, list[str]]) -> None:
    pins: dict[str, dict[str, list[str]]] = {}
    for line, sources in requirements.items():
        requirement = Requirement(line)
        for specifier in requirement.specifier:
            if specifier.operator in ("==", "==="):
                pins.setdefault(canonicalize_name(requirement.name), {}).setdefault(
                    specifier.version, []).extend(sources)
    for name, versions in pins.items():
        if len(versions) > 1:
            detail = "; ".join(f"=={version} from {', '.join(sources)}"
                               for version, sources in sorted(versions.items()))
            raise SpecError(
                f"{name} is pinned to different versions: {detail}. One image has one "
                f"environment: agree on one version"
            )


def _declared(op: object) -> object:
    while True:
        declared = getattr(op, REQUIREMENTS_ATTRIBUTE, None)
        if declared is not None or not isinstance(op, functools.partial):
            return declared
        op = op.func


def _operator_name(op: object) -> str:
    while isinstance(op, functools.partial):
        op = op.func
    return getattr(op, "__qualname__", None) or type(op).__qualname__


def _strip_comment(line: str) -> str:
    if line.lstrip().startswith("#"):
        return ""
    position = line.find(" #")
    return (line[:position] if position >= 0 else line).strip()


def _sort_key(requirement: str) -> tuple[str, str]:
    return canonicalize_name(Requirement(requirement).name), requirement


def _conda_name(dependency: str) -> str:
    head = dependency.split("::")[-1]
    for separator in ("=", "<", ">", "!", " ", "["):
        head = head.split(separator)[0]
    return head.strip().lower()


def _conda_pin(dependency: str) -> str:
    """The version of ``name=3.11`` / ``name==3.11.*`` / ``name 3.11``; "" for ranges."""
    rest = dependency.split("::")[-1][len(_conda_name(dependency)):].strip()
    if rest[:1] in ("<", ">", "!"):
        return ""
    return rest.lstrip("= ").split(" ")[0].rstrip(".*")

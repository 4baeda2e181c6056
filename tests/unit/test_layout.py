"""The layout as a contract: packages in layers, no import cycle, the job's stages in order,
one error root — read from the source, so a change that breaks the map fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import builder
from builder import TritonBuilderError

ROOT = Path(builder.__file__).parent

# Lowest first: a unit may import only the units before it. ``runtime`` (the code that runs
# in the container) is the bottom: it imports nothing of the builder. The stages of the job,
# in their order, sit between the plumbing (errors, cache, engine, ...) and the entry points
# (job, cli).
LAYERS = [
    "runtime",
    "errors", "build_epoch", "interrupts", "cache", "host_lock", "progress", "host_packages",
    "engine",
    "tritonserver",
    "pipeline", "client",
    "base", "bridge", "repository", "environment", "image", "verify", "push", "deploy",
    "tune", "job", "doctor", "cli", "builder",
]
STAGES = ["pipeline", "base", "bridge", "repository", "environment", "image", "verify", "push"]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ("builder", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(path: Path) -> set[str]:
    """Every ``builder`` module ``path`` imports, at any depth (imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("builder"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("builder"))
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "builder"


MODULES = _modules()
GRAPH = {name: {target for target in _imports(path) if target in MODULES and target != name}
         for name, path in MODULES.items()}


def test_every_unit_has_its_place_in_the_layers():
    units = {_unit(name) for name in MODULES}
    assert units == set(LAYERS), f"place these in LAYERS: {sorted(units - set(LAYERS))}"


def test_units_import_only_the_layers_below_them():
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items() if _unit(name) != "runtime"
        for target in targets
        if _unit(target) != _unit(name)
        and LAYERS.index(_unit(target)) > LAYERS.index(_unit(name))
    )
    assert not upward, "\n".join(upward)


def test_the_code_that_runs_inside_triton_imports_nothing_of_the_builder():
    leaks = sorted(f"{name} imports {target}" for name, targets in GRAPH.items()
                   if _unit(name) == "runtime" for target in targets if _unit(target) != "runtime")
    assert not leaks, "\n".join(leaks)


def test_no_module_import_cycle():
    """Tarjan's strongly connected components over the module graph: all of size one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            # a package and the modules its __init__ re-exports are one unit, not a cycle
            if len({m for m in component if m not in _packages_of(component)}) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not cycles, cycles


def _packages_of(component: list[str]) -> set[str]:
    return {m for m in component if MODULES[m].name == "__init__.py"}


DECISIONS = {"resolve": "base", "plan_python": "bridge", "require_buildable": "bridge",
             "require_platform_wheels": "environment"}
"""Calls that only decide (nothing pulled, built or written): the job makes them all before any
stage does work, so bad input is refused before anything is written."""


def _stage_calls(function: ast.FunctionDef, names: dict[str, str]) -> list[str]:
    """The stages ``function`` calls into on its success path, in source order (nested
    functions, exception handlers and raised errors left out; calls to the job's own helpers
    followed; option objects built on the way left out; decisions as ``decide:<stage>``)."""
    stages = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.Lambda | ast.ExceptHandler):
                continue
            walk(child)
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                callee = child.func.id
                if callee in JOB_FUNCTIONS:
                    stages.extend(_stage_calls(JOB_FUNCTIONS[callee], names))
                elif callee in DECISIONS:
                    stages.append(f"decide:{DECISIONS[callee]}")
                elif callee.endswith(("Options", "Error")):
                    continue
                elif names.get(callee) in STAGES:
                    stages.append(names[callee])

    walk(function)
    return stages


JOB_SOURCES = {path.stem: ast.parse(path.read_text()) for path in (ROOT / "job").glob("*.py")}
JOB_FUNCTIONS = {node.name: node for source in JOB_SOURCES.values() for node in source.body
                 if isinstance(node, ast.FunctionDef)}
JOB_IMPORTS = [node for source in JOB_SOURCES.values() for node in source.body
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.startswith("builder.")]
JOB_STAGES = ["pipeline", "decide:base", "decide:bridge", "decide:environment", "base", "bridge",
              "repository", "environment", "image", "verify", "push"]
"""The in-process pipeline first (its answers are the reference), then the decisions, then one
entry per stage (a multi-platform build asks first that every requirement has a wheel for every
platform: :func:`builder.environment.platform_wheels.require_platform_wheels`): the base image;
the bridge's plan held against the Python that image's stub
really links (:func:`builder.bridge.base_python.fit_base_python`: it needs the image on the
engine, and must refuse before the repository is written); then the rest. The bridge's parts
are made by the environment stage (:func:`builder.environment.prepare.prepare_environment`)."""


@pytest.mark.parametrize("entry", ["build_docker_image", "build_image_from_repository"])
def test_the_job_enters_each_stage_once_in_order(entry):
    names = {alias.asname or alias.name: _unit(node.module)
             for node in JOB_IMPORTS for alias in node.names}
    names["pipe"] = "pipeline"  # the in-process pipeline: the reference answers come first
    visited = []
    for stage in _stage_calls(JOB_FUNCTIONS[entry], names):
        if not visited or visited[-1] != stage:
            visited.append(stage)
    assert len(visited) == len(set(visited)), f"a stage entered twice: {visited}"
    expected = (JOB_STAGES if entry == "build_docker_image"
                else ["decide:base", "base", "image", "verify", "push"])
    assert visited == expected


def test_the_job_imports_only_packages():
    """The job reads as a list of stages: it imports each stage's front door (its package),
    never a module inside one (its own modules aside)."""
    inner = sorted(node.module for node in JOB_IMPORTS
                   if node.module.count(".") > 1 and not node.module.startswith("builder.job."))
    modules = sorted(node.module for node in JOB_IMPORTS
                     if not (ROOT / node.module.split(".", 1)[1].replace(".", "/")).is_dir()
                     and _unit(node.module) in STAGES)
    assert inner == [] and modules == []


def _body_lines(function: ast.FunctionDef) -> int:
    """The lines of ``function``'s body, its docstring left out."""
    body = function.body[1:] if ast.get_docstring(function) else function.body
    return body[-1].end_lineno - body[0].lineno + 1


def _function(module: Path, name: str) -> ast.FunctionDef:
    (found,) = [node for node in ast.parse(module.read_text()).body
                if isinstance(node, ast.FunctionDef) and node.name == name]
    return found


def test_build_docker_image_reads_as_its_steps():
    """Options, plan, each platform, tags, push: a body a reader takes in at once."""
    assert _body_lines(JOB_FUNCTIONS["build_docker_image"]) <= 40


def test_build_pipeline_model_reads_as_its_steps():
    """Options, validate, plan, write: the repository stage's entry held to the job's rule."""
    assert _body_lines(_function(ROOT / "repository" / "writer.py", "build_pipeline_model")) <= 40


def test_no_keyword_travels_unnamed_through_the_job():
    """``**`` in the job only where the names are an object's fields: the user's keywords into
    :func:`builder.job.build_options` (which refuses an unknown one) and a dataclass's
    ``vars``."""
    unnamed = []
    for module, source in JOB_SOURCES.items():
        for node in ast.walk(source):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg is not None:
                    continue
                value = keyword.value
                named = (isinstance(node.func, ast.Name) and node.func.id == "build_options") or (
                    isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                    and value.func.id == "vars")
                if not named and not (module == "build_options"):
                    unnamed.append(f"{module}.py:{node.lineno}")
    assert unnamed == []


def test_no_two_modules_share_a_name():
    """A file name says which concept it holds, wherever it is (a package's errors.py aside)."""
    seen: dict[str, list[str]] = {}
    for path in ROOT.rglob("*.py"):
        if path.name not in ("__init__.py", "errors.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_unit_tests_mirror_the_packages():
    """Every package of the builder has its folder of unit tests, named as it is."""
    units = ROOT.parent / "tests" / "unit"
    top = sorted({p.parent.relative_to(ROOT).parts[0] for p in ROOT.rglob("__init__.py")
                  if p.parent != ROOT})
    missing = [package for package in top if not any((units / package).glob("test_*.py"))]
    assert not missing, f"packages without unit tests in tests/unit/: {missing}"


def test_the_environment_stage_makes_the_bridges_parts():
    source = (ROOT / "environment" / "prepare.py").read_text()
    assert "prepare_bridge(" in source


def _our_exceptions() -> list[type[BaseException]]:
    found = set()
    for info in pkgutil.walk_packages(builder.__path__, "builder."):
        if ".runtime" in info.name:
            continue  # runs inside Triton: raises pb_utils.TritonError, not ours
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("builder."):
                found.add(value)
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def test_every_error_of_ours_has_the_root_and_a_builtin_category():
    """Errors (``Exception``) have the root; the only other exceptions of ours are interrupts,
    KeyboardInterrupts, which no ``except Exception`` may swallow."""
    exceptions = [error for error in _our_exceptions() if issubclass(error, Exception)]
    interrupts = [error for error in _our_exceptions() if not issubclass(error, Exception)]
    assert all(issubclass(interrupt, KeyboardInterrupt) for interrupt in interrupts), interrupts
    assert len(exceptions) >= 30
    for error in exceptions:
        assert issubclass(error, TritonBuilderError), error
        if error is TritonBuilderError:
            continue
        builtin = [base for base in error.__mro__
                   if base.__module__ == "builtins" and base not in (Exception, BaseException,
                                                                     object)]
        assert builtin, f"{error.__qualname__} has no built-in category"


def test_the_public_face():
    for name in ("build_docker_image", "build_pipeline_model", "ImageBuild", "Client",
                 "AsyncClient", "TritonRemoteModel", "pipe", "ModelOp", "TritonBuilderError",
                 "PipelineError", "EnvironmentBuildError", "ImageBuildError",
                 "VerificationError", "PushError", "EngineError", "UnsupportedCudaError",
                 "InvalidReferenceError", "InputError"):
        assert name in builder.__all__, name
        assert getattr(builder, name) is not None
    errors = [getattr(builder, name) for name in builder.__all__ if name.endswith("Error")]
    assert all(issubclass(error, TritonBuilderError) for error in errors)


def test_every_package_is_in_the_distribution():
    """An editable install finds any folder; a wheel holds only the packages pyproject lists."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {".".join(("builder", *path.parent.relative_to(ROOT).parts))
                for path in ROOT.rglob("__init__.py")}
    assert packages <= listed, f"add to pyproject.toml: {sorted(packages - listed)}"


def test_no_module_is_a_room_too_big_to_live_in():
    """A module holds one concept: none over 600 lines; the supervisor's (PID 1 of every image,
    read when something goes wrong at 3 a.m.) none over 300."""
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in ROOT.rglob("*.py")}
    assert {name: size for name, size in sizes.items() if size > 600} == {}
    assert {name: size for name, size in sizes.items()
            if name.startswith("runtime/supervisor/") and size > 300} == {}


def test_an_export_format_is_one_record_and_no_stage_names_one():
    """A format is added in ``repository/export.py`` (its exporter and its ``ExportFormat``)
    and, where the python backend runs it, its runtime file: no module compares a model's
    format with a name, and Triton's platform table is defined once (issue 68, item 3)."""
    import re

    from builder.repository.export import EXPORT_FORMATS

    compared = re.compile(r"""format\s*(==|!=)\s*["']|format\s+(not\s+)?in\s+[(\[{]["']""")
    offenders = [f"{path.relative_to(ROOT)}:{number}" for path in sorted(ROOT.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if compared.search(line)]
    assert not offenders, offenders
    tables = [path.relative_to(ROOT) for path in ROOT.rglob("*.py")
              if re.search(r"^_?PLATFORM_BACKENDS\b.*=", path.read_text(), re.MULTILINE)]
    assert tables == [Path("repository/config_rules.py")], tables
    for name, record in EXPORT_FORMATS.items():
        assert record.name == name and callable(record.export)
        assert (record.platform is None) != (record.backend is None), name


def test_served_batching_is_one_runtime_module_and_a_model_operator_gives_parameters():
    """Grouping rows by shape, chunking them to ``max_batch_size``, padding rows of different
    lengths into one call and cutting the answers back: all in ``runtime/model_batching.py``,
    which the build's own padding check uses too; ``ModelOp`` says only what to pad with
    (issue 68, item 4)."""
    from builder.pipeline.operators import ModelOp

    wanted = {"BatchingRunner", "pad_rows", "cut_rows", "length_chunks", "batch_key",
              "_chunks", "_split_rows"}
    defined: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
                defined.setdefault(node.name, []).append(path.relative_to(ROOT).as_posix())
    assert defined == {name: ["runtime/model_batching.py"] for name in wanted}, defined
    batching_methods = [name for name in vars(ModelOp)
                        if name.startswith(("pad", "cut", "_pad")) and name != "padding"]
    assert batching_methods == [], batching_methods

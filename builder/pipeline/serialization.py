"""Capturing a pipeline into ``pipe.pickle`` so it loads where the user's code does not exist.

Why by value: a custom operator may live in a module anywhere on disk (a script, a temporary
directory, a checkout) that the serving image does not have. Every imported module that is not
part of the Python installation — the user's modules and this project itself — is pickled *by
value* with cloudpickle: the image needs neither the user's source nor ``triton-builder``
installed. Installed packages (numpy, ...) are pickled by reference and must be installed where
the pipeline is served; their versions are recorded beside the pickle (``pipe.versions.json``) and
checked when the served model loads (:mod:`builder.runtime.pipeline_model`).

A :class:`~builder.pipeline.operators.ModelOp` is pickled without its torch module and example
inputs: in the served pipeline it only needs the
:class:`~builder.pipeline.operators.BlsTarget` of its exported model.
"""

from __future__ import annotations

import contextlib
import copyreg
import importlib.metadata
import io
import pickle
import platform
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

import cloudpickle

from builder.errors import SerializationError
from builder.pipeline.operators import BlsTarget, ModelOp, restore_model_op
from builder.pipeline.user_code import (
    distributions_of,
    installation_paths,
    is_installed,
    user_modules,
)

PIPELINE_FILE = "pipe.pickle"
VERSIONS_FILE = "pipe.versions.json"


class _ServingPickler(cloudpickle.Pickler):
    """cloudpickle, with model operators reduced to their served form and imports recorded."""

    def __init__(self, targets: Mapping[str, BlsTarget]) -> None:
        self._buffer = io.BytesIO()
        super().__init__(self._buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self._targets = targets
        self.referenced_modules: set[str] = set()
        self.classes: set[type] = set()

    def payload(self) -> bytes:
        return self._buffer.getvalue()

    def reducer_override(self, obj: Any) -> Any:
        """Model operators in their served form; every class with its ``__slotnames__`` set.

        Why the slot names: copyreg caches them on a class the first time an *instance* of it is
        pickled, and a class pickled by value carries its ``__dict__``. A class of ours whose
        instances a pipeline lacks (``ModelFields``, reached through ``operator_name``) was
        pickled with the cache where an earlier pickle in the same process had held an instance
        of it, and without it elsewhere: two builds of one pipeline made two images.
        """
        if isinstance(obj, type):
            self.classes.add(obj)
            _track_class(obj)
            copyreg._slotnames(obj)  # type: ignore[attr-defined]  # private, not in typeshed
        if isinstance(obj, ModelOp) and obj.module is not None:
            target = self._targets.get(obj.name)
            if target is None:
                raise SerializationError(
                    f"model operator {obj.name!r} has no exported model to call"
                )
            return restore_model_op, (type(obj), obj.serving_state(target))
        reduced = super().reducer_override(obj)
        if isinstance(obj, type) and isinstance(reduced, tuple) and len(reduced) == 6 \
                and reduced[5] is cloudpickle.cloudpickle._class_setstate:  # noqa: SLF001
            reduced = (*reduced[:5], _set_class_state)
        return reduced

    def persistent_id(self, obj: Any) -> None:
        """Never replaces anything; notes which modules the pickle will import on load."""
        if isinstance(obj, types.ModuleType):
            self.referenced_modules.add(obj.__name__)
        elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(obj, "__module__", None)
            if isinstance(module, str):
                self.referenced_modules.add(module)
        return None


def _track_class(cls: type) -> None:
    """Give a class pickled by value a tracker ID that is the same in every process.

    cloudpickle names each class it pickles by value with a tracker ID, so that classes from
    one definition stay one class where they are loaded; its own IDs are random (uuid4), which
    made ``pipe.pickle`` — and so the image's content hash — differ on every run of the builder
    even for an unchanged pipeline. The ID here is the class's module and qualified name, with
    an ordinal that keeps two classes of the same name (a class statement run twice) apart.
    """
    tracker = cloudpickle.cloudpickle
    with tracker._DYNAMIC_CLASS_TRACKER_LOCK:
        if cls in tracker._DYNAMIC_CLASS_TRACKER_BY_CLASS:
            return
        name = f"{cls.__module__}.{cls.__qualname__}"
        ordinal = 0
        while (key := f"{name}#{ordinal}") in tracker._DYNAMIC_CLASS_TRACKER_BY_ID:
            ordinal += 1
        tracker._DYNAMIC_CLASS_TRACKER_BY_CLASS[cls] = key
        tracker._DYNAMIC_CLASS_TRACKER_BY_ID[key] = cls


def _set_class_state(cls: type, state: tuple) -> type:
    """cloudpickle's state setter for a class pickled by value, except on the live class.

    Loaded where it was defined, a class pickled by value resolves to the live class (its
    tracker ID), and cloudpickle sets the pickled attributes back onto it: copies of its
    methods, whose globals are a copy of their module's. A plain ``pickle.loads`` of a
    ``pipe.pickle`` in the building process would then change the user's classes, and the next
    build's pickle (so its image) with them. The class its module still holds under its name is
    the definition itself and is left as it is; a class made by the load (where the pipeline is
    served) gets its state as cloudpickle gives it. Pickled by value into every
    ``pipe.pickle``: it runs where the pipeline is served, on Python 3.8 too.
    """
    found = sys.modules.get(cls.__module__)
    try:
        for name in cls.__qualname__.split("."):
            found = getattr(found, name, None)
    except Exception:  # noqa: BLE001 - a module's __getattr__ may fail: not found, then
        found = None
    if found is cls:
        return cls
    return cloudpickle.cloudpickle._class_setstate(cls, state)  # noqa: SLF001


@contextlib.contextmanager
def user_code_by_value() -> Iterator[list[str]]:
    """Register every imported non-installed module with cloudpickle as by-value, then undo it."""
    registered = []
    # Modules the user registered themselves stay registered afterwards.
    already = set(getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", ()))
    try:
        for name in user_modules():
            if name in already:
                continue
            cloudpickle.register_pickle_by_value(sys.modules[name])
            registered.append(name)
        yield registered
    finally:
        for name in registered:
            with contextlib.suppress(ValueError, KeyError):
                cloudpickle.unregister_pickle_by_value(sys.modules[name])


def dumps(obj: Any, targets: Mapping[str, BlsTarget] | None = None) -> tuple[bytes, set[str]]:
    """Pickle ``obj`` with user code by value; also return the modules it imports on load.

    Pickled twice, the first result thrown away: pickling a class by value for the first time
    caches ``__slotnames__`` on it (``copyreg``), which changes what the next pickle of that
    class holds. The second pickle is the stable one, so an unchanged pipeline gives the same
    bytes on every build and its image is not rebuilt.
    """
    pickler = _pickled(obj, targets)
    return pickler.payload(), pickler.referenced_modules


def round_trip(obj: Any, targets: Mapping[str, BlsTarget] | None = None) -> tuple[bytes, Any]:
    """``dumps(obj)``'s bytes, and the object loaded back from them in this process.

    The caller's classes are left as they were. :func:`_set_class_state` keeps the load off a
    class its module holds; one defined in a function (no name to find it by) is put back here.
    Otherwise the live operator would no longer see later changes to its module, and the next
    pickle would hold the load's copies of its methods (a set in them may iterate in another
    order), so an unchanged pipeline would build a new image.
    """
    pickler = _pickled(obj, targets)
    classes = {cls: dict(vars(cls)) for cls in pickler.classes}
    try:
        return pickler.payload(), pickle.loads(pickler.payload())
    finally:
        _restore(classes)


def check_serializable(obj: Any, what: str, targets: Mapping[str, BlsTarget] | None = None) -> None:
    """Pickle and unpickle ``obj`` (an operator); the error names ``what`` on failure."""
    try:
        round_trip(obj, targets)
    except Exception as error:  # noqa: BLE001 - any failure means it cannot be deployed
        raise SerializationError(
            f"operator {what} cannot be serialized into {PIPELINE_FILE}: "
            f"{type(error).__name__}: {error}"
        ) from error


def versions_record(referenced_modules: set[str]) -> dict[str, Any]:
    """Python and library versions the pickle needs where it is loaded.

    Libraries are the distributions providing installed, non-standard-library modules the pickle
    refers to by reference.
    """
    libraries: dict[str, str] = {}
    modules: dict[str, str] = {}
    stdlib = _stdlib_paths()
    for name in sorted(referenced_modules):
        top = name.split(".")[0]
        if top in ("builtins", "__main__") or top in sys.builtin_module_names:
            continue
        if not is_installed(top) or _in_stdlib(top, stdlib):
            continue
        for distribution in distributions_of(top) or [top]:
            try:
                libraries[distribution] = importlib.metadata.version(distribution)
                modules[top] = distribution
            except importlib.metadata.PackageNotFoundError:
                continue
    libraries.setdefault("cloudpickle", cloudpickle.__version__)
    modules.setdefault("cloudpickle", "cloudpickle")
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "libraries": libraries,
        "modules": modules,
    }


def _pickled(obj: Any, targets: Mapping[str, BlsTarget] | None) -> _ServingPickler:
    with user_code_by_value():
        for _ in range(2):  # see dumps
            pickler = _ServingPickler(targets or {})
            pickler.dump(obj)
    return pickler


def _restore(classes: dict[type, dict[str, Any]]) -> None:
    """Put back the class attributes that unpickling replaced (see round_trip)."""
    for cls, attributes in classes.items():
        current = vars(cls)
        for name in [name for name in current if name not in attributes]:
            delattr(cls, name)
        for name, value in attributes.items():
            if current.get(name) is not value:
                setattr(cls, name, value)


def _stdlib_paths() -> tuple[str, ...]:
    return tuple(p for p in installation_paths() if "site-packages" not in p
                 and "dist-packages" not in p)


def _in_stdlib(top: str, stdlib: tuple[str, ...]) -> bool:
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None) or ""
    if "site-packages" in path or "dist-packages" in path:
        return False
    return any(path.startswith(p) for p in stdlib)

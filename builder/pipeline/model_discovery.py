"""Finding the model operators a pipeline holds, wherever its code keeps them.

Why: a model operator may sit inside another operator (a decoder inside a greedy-decoding loop);
the build must export it and the served pipeline must bind it to BLS.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from builder.pipeline.operators import ModelOp
from builder.pipeline.user_code import is_installed


def find_model_ops(roots: Sequence[Any], max_depth: int = 8) -> list[ModelOp]:
    """Every :class:`ModelOp` reachable from ``roots``, in discovery order.

    Why: a model operator may sit inside another operator (a decoder inside a greedy-decoding
    loop); the build must export it and the served pipeline must bind it to BLS. We follow what
    such code can reach: attributes, closures, ``functools.partial`` arguments, bound methods,
    containers, and the globals a function of a user's module refers to.
    """
    found: dict[int, ModelOp] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if depth > max_depth or id(obj) in seen or _is_leaf(obj):
            return
        seen.add(id(obj))
        if isinstance(obj, ModelOp):
            found.setdefault(id(obj), obj)
            for part in (obj.pre, obj.post):
                visit(part, depth + 1)
            return
        for child in _children(obj):
            visit(child, depth + 1)

    for root in roots:
        visit(root, 0)
    return list(found.values())


def _children(obj: Any) -> Iterator[Any]:  # noqa: C901 - issue 68: to be split
    if isinstance(obj, dict):
        yield from obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
    elif isinstance(obj, functools.partial):
        yield obj.func
        yield from obj.args
        yield from obj.keywords.values()
    elif isinstance(obj, types.MethodType):
        yield obj.__func__
        yield obj.__self__
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue
        yield from obj.__defaults__ or ()
        if not is_installed(obj.__module__):
            for name in _referenced_names(obj.__code__):
                if name in obj.__globals__:
                    yield obj.__globals__[name]
    elif isinstance(obj, type):
        if not is_installed(obj.__module__):  # a user class may hold model ops as attributes
            yield from (v for k, v in vars(obj).items() if not k.startswith("__"))
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            yield from state.values()
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                yield getattr(obj, slot)
        yield type(obj)
        for method in ("__call__", "call_batch"):  # their globals may hold model operators
            function = getattr(type(obj), method, None)
            if isinstance(function, types.FunctionType):
                yield function


def _referenced_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _referenced_names(const)


def _is_leaf(obj: Any) -> bool:
    if isinstance(obj, (str, bytes, bytearray, int, float, complex, bool, type(None),
                        np.ndarray, np.generic, types.ModuleType, types.BuiltinFunctionType)):
        return True
    module = type(obj).__module__ or ""
    return module.split(".")[0] in ("torch", "numpy", "onnx", "onnxruntime")

"""A pipeline named on the command line (``file.py:attr`` or ``module:attr``), imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def load_pipeline(reference: str) -> Any:
    """Import ``file.py:attr`` or ``module:attr`` and return the attribute.

    A file inside a package (``pipelines/text_embedding.py``) is imported as that package's
    module, with the package's parent on ``sys.path``, so its own imports work.
    """
    import importlib

    from builder.errors import PipelineError, TritonBuilderError
    from builder.pipeline.dsl import Pipeline

    target, _, attribute = reference.rpartition(":")
    if not target or not attribute:
        raise ValueError(f"{reference!r} is not 'file.py:attr' or 'module:attr'")
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"no such pipeline file: {target}")
        parts, root = [path.stem], path.parent
        while (root / "__init__.py").exists():
            parts.insert(0, root.name)
            root = root.parent
        sys.path.insert(0, str(root))
        target = ".".join(parts)
    try:
        module = importlib.import_module(target)
    except TritonBuilderError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's code: say where it failed
        raise PipelineError(f"importing {target} failed{_where(error)}: "
                            f"{type(error).__name__}: {error}") from error
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{target} has no attribute {attribute!r}") from None
    if not isinstance(value, Pipeline):
        raise ValueError(f"{reference} is a {type(value).__name__}, not a finished pipeline "
                         f"(end it with .output(...))")
    return value


def _where(error: BaseException) -> str:
    """`` at file:line``: the innermost frame outside Python and its packages (the user's
    line, not torch's), or a syntax error's own line."""
    import traceback

    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(("<", sys.prefix, sys.base_prefix))]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""

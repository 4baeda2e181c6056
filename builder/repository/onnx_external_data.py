"""An ONNX model's weights in one data file beside its graph, for models past protobuf's 2 GiB.

A serialized ONNX model is one protobuf message, and protobuf refuses messages of 2 GiB or
more: past that size the graph keeps its tensors as *external data*, each tensor naming a file
beside the graph, an offset and a length. Triton's onnxruntime backend and ONNX Runtime read
them from the version directory, relative to ``model.onnx``.

The exporters write that data in different shapes: torch's TorchScript-based exporter one file
per tensor, named after the tensor (``embedding.weight``, ``onnx::MatMul_12`` ...); its
``torch.export``-based one a single ``model.onnx.data``. :func:`gather_external_data` makes
every export the same two files, ``model.onnx`` and ``model.onnx.data`` — one weights file per
model, whose digest says whether the model changed — copying each tensor's bytes through a
bounded buffer, never the whole model in memory. Tensors of :data:`ALIGN_FROM` bytes or more
start at a multiple of :data:`ALIGNMENT` (the allocation granularity ONNX Runtime needs to map a
tensor from the file instead of copying it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROTOBUF_LIMIT = 2**31
"""The largest message protobuf serializes, in bytes: a model with this much weight keeps it in
a data file."""
EXTERNAL_DATA_BYTES = 2**30
"""Weights from which the ``torch.export``-based exporter is asked for external data (the graph
and its protobuf overhead come on top of the weights: half the limit leaves room)."""
ALIGNMENT = 64 * 1024
ALIGN_FROM = 1024 * 1024
COPY_CHUNK = 16 * 1024 * 1024


def data_file_name(model_file: str | os.PathLike) -> str:
    """``model.onnx`` → ``model.onnx.data``: the one data file beside a graph."""
    return f"{Path(model_file).name}.data"


def gather_external_data(path: str | os.PathLike) -> Path | None:
    """Rewrite the model at ``path`` so that all its external tensors live in one data file.

    Returns the data file, or ``None`` for a model whose tensors are all inside the graph (it
    is left as it is). The files the tensors were read from are removed once the graph names the
    new one; a file outside the model's directory is refused (ONNX Runtime would refuse it too).
    """
    import onnx

    path = Path(path)
    directory = path.parent.resolve()
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in _tensors(model.graph) if _is_external(t)]
    if not external:
        return None
    target = directory / data_file_name(path)
    sources = {_source(directory, t) for t in external}
    if sources == {target} and _aligned(external):
        return target
    partial = target.with_name(f".{target.name}.partial")
    try:
        with partial.open("wb") as out:
            for tensor in external:
                info = _info(tensor)
                offset, length = _append(_source(directory, tensor), int(info.get("offset", 0)),
                                         info.get("length"), out, tensor.name)
                _point(tensor, target.name, offset, length)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    path.write_bytes(model.SerializeToString())
    for source in sources - {target}:
        source.unlink(missing_ok=True)
    return target


def _append(source: Path, offset: int, length: str | None, out: Any,
            name: str) -> tuple[int, int]:
    """Append ``length`` bytes of ``source`` from ``offset`` to ``out``, aligned, through a
    bounded buffer; returns where they start in ``out`` and how many."""
    size = source.stat().st_size - offset if length is None else int(length)
    start = out.tell()
    if size >= ALIGN_FROM and start % ALIGNMENT:
        out.write(b"\0" * (ALIGNMENT - start % ALIGNMENT))
        start = out.tell()
    with source.open("rb") as data:
        data.seek(offset)
        left = size
        while left:
            chunk = data.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ValueError(f"tensor {name!r}: {source.name} ends {left} bytes early")
            out.write(chunk)
            left -= len(chunk)
    return start, size


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor of a graph and its subgraphs: initializers and constant attributes."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def _is_external(tensor: Any) -> bool:
    import onnx

    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _info(tensor: Any) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _source(directory: Path, tensor: Any) -> Path:
    location = _info(tensor).get("location", "")
    source = (directory / location).resolve()
    if not location or directory not in source.parents:
        raise ValueError(f"tensor {tensor.name!r} names external data {location!r}, which is "
                         f"not a file beside the model")
    return source


def _aligned(tensors: list[Any]) -> bool:
    return all(int(_info(t).get("offset", 0)) % ALIGNMENT == 0 for t in tensors
               if int(_info(t).get("length", 0)) >= ALIGN_FROM)


def _point(tensor: Any, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value

"""Generated pipelines: each is refused before anything is written, or served as in process.

Issue 33: a pipeline written as the README showed it wrote a repository Triton refused, and
nothing said so until the image's verification. Here hypothesis generates pipelines over what
users combine — string, scalar (float and int), 1-D and 2-D columns; per-row and vectorized
Python operators before and after; a model operator (elementwise, linear, reducing, embedding)
with per-row examples, or batched ones with ``pre=``/``post=``, exported to ONNX or served as
python, reached in the pipeline model's process or over BLS — and some with the mistakes the
batch-axis rule catches. Each pipeline must be either

* refused with a :class:`~builder.PipelineError` naming its model operator, with nothing
  written, exactly where the generator made a mistake, or
* written, loaded by a real Triton (the test bed's host ``tritonserver``, in explicit model
  control: each pipeline's models are loaded, called and unloaded in turn) and served equal to
  the in-process pipeline, call by call and as concurrent requests.

Bounded: ``TRITON_BUILDER_HYPOTHESIS_EXAMPLES`` pipelines (default 12, about a minute here), no
shrinking unless ``TRITON_BUILDER_HYPOTHESIS_SHRINK=1``. The seed is random per run and printed;
``TRITON_BUILDER_HYPOTHESIS_SEED=<seed>`` runs the same pipelines again.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from builder import ModelOp, PipelineError, build_pipeline_model, pipe, vectorized
from builder.client.pipeline import Client
from builder.verify.equality import check_same

pytestmark = pytest.mark.alongside

SEED = int(os.environ.get("TRITON_BUILDER_HYPOTHESIS_SEED") or secrets.randbelow(2 ** 32))
EXAMPLES = int(os.environ.get("TRITON_BUILDER_HYPOTHESIS_EXAMPLES", "12"))
PHASES = [Phase.explicit, Phase.generate] + (
    [Phase.shrink] if os.environ.get("TRITON_BUILDER_HYPOTHESIS_SHRINK") == "1" else [])

COLUMNS = ("text", "float", "int", "vector", "matrix")
MODULES = {"text": ("scale", "linear", "sum"), "float": ("scale",), "int": ("embed",),
           "vector": ("scale", "linear", "sum"), "matrix": ("scale", "linear", "sum")}
"""The modules that can take one row of each column (text: its feature vector)."""
REFUSALS = {
    "batched_without_pre": "example_inputs seem to hold a batch axis",
    "module_mismatch": "the module fails on one row of example_inputs",
    "row_mismatch": "in this row, but example_inputs give one row as",
}
"""The mistakes generated on purpose, and what the refusal must say."""
VOCABULARY = 10


@dataclass(frozen=True)
class Case:
    """One generated pipeline, as plain parameters (hypothesis prints them on failure)."""

    column: str
    shape: tuple[int, ...]
    """One row's shape: the vector or matrix, the text's feature vector; () for scalars."""
    before: str
    module: str
    examples: str
    example_type: str
    after: str
    text_out: bool
    model_format: str
    in_process: bool
    calls: tuple[Any, ...]


# -- operators: module-level, so pickling them by value is what a user's file gets ----------
def featurize(text: str, length: int) -> np.ndarray:
    counts = np.zeros(length, np.float32)
    for character in text:
        counts[ord(character) % length] += 1.0
    return counts / max(1, len(text))


def shift(x: Any) -> Any:
    return x * 0.5 + 0.25


vectorized_shift = vectorized(shift)


def squash(y: Any) -> Any:
    return np.tanh(y)


vectorized_squash = vectorized(squash)


def describe(value: Any) -> str:
    return value.upper() if isinstance(value, str) else f"row of shape {np.shape(value)}"


def add_batch_axis(*values: Any) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(v)[None] for v in values)


def first_row(batch: np.ndarray) -> np.ndarray:
    return batch[0]


class Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(1.5))
        self.bias = torch.nn.Parameter(torch.tensor(-0.25))

    def forward(self, x):
        return x * self.weight + self.bias


class Sum(torch.nn.Module):
    """Sums a row's first axis (module axis 1): a vector's row becomes a scalar."""

    def forward(self, x):
        return x.sum(1)


def make_module(case: Case) -> torch.nn.Module:
    torch.manual_seed(0)
    mistaken = case.examples in ("module_mismatch", "row_mismatch")  # wider than the rows
    width = (case.shape or (1,))[-1] + (1 if mistaken else 0)
    return {"scale": Scale, "sum": Sum,
            "linear": lambda: torch.nn.Linear(width, 3),
            "embed": lambda: torch.nn.Embedding(VOCABULARY, 4)}[case.module]().eval()


def example_input(case: Case) -> Any:
    shape = case.shape
    if case.examples == "row_mismatch":
        shape = (*shape[:-1], shape[-1] + 1) if shape else (2,)
    if case.examples in ("batched", "batched_without_pre"):
        shape = (1, *shape)
    array = (np.full(shape, 3, np.int64) if case.column == "int"
             else np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape))
    return torch.from_numpy(array) if case.example_type == "torch" else array


def make_pipeline(case: Case, number: int):
    """The pipeline ``case`` describes; raises where the case makes a mistake at construction."""
    name = f"m{number}"
    batched = case.examples == "batched"
    op = ModelOp(make_module(case), example_inputs=example_input(case), name=name,
                 pre=add_batch_axis if batched else None, post=first_row if batched else None,
                 op_config={"format_priority": [case.model_format]})
    builder = pipe.input("x")
    column = "x"
    if case.column == "text":
        length = case.shape[0]
        builder = builder.map("x", "features", lambda text: featurize(text, length),
                              name="featurize")
        column = "features"
    elif case.before != "none":
        builder = builder.map("x", "before", shift if case.before == "row" else vectorized_shift)
        column = "before"
    builder = builder.map(column, "y", op)
    outputs = ["y"]
    if case.after != "none":
        builder = builder.map("y", "z", squash if case.after == "row" else vectorized_squash)
        outputs = ["z"]
    if case.text_out:
        builder = builder.map("x", "label", describe)
        outputs.append("label")
    return builder.output(*outputs).with_example(case.calls[0]), name


# -- the strategy ------------------------------------------------------------------------------
@st.composite
def cases(draw) -> Case:
    column = draw(st.sampled_from(COLUMNS))
    shape = {"text": lambda: (draw(st.integers(2, 6)),), "float": tuple, "int": tuple,
             "vector": lambda: (draw(st.integers(1, 5)),),
             "matrix": lambda: (draw(st.integers(1, 3)), draw(st.integers(1, 4)))}[column]()
    module = draw(st.sampled_from(MODULES[column]))
    mistakes = ["batched_without_pre", "row_mismatch"] + (
        ["module_mismatch"] if module == "linear" else [])
    examples = draw(st.sampled_from(["row", "row", "row", "batched", *mistakes]))
    values = {
        "text": st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
        "float": st.floats(-2, 2, width=32),
        "int": st.integers(0, VOCABULARY - 1),
        "vector": hnp.arrays(np.float32, shape, elements=st.floats(-2, 2, width=32)),
        "matrix": hnp.arrays(np.float32, shape, elements=st.floats(-2, 2, width=32)),
    }[column]
    return Case(
        column=column, shape=shape,
        before="none" if column in ("text", "int") else draw(
            st.sampled_from(["none", "row", "vectorized"])),
        module=module, examples=examples,
        example_type=draw(st.sampled_from(["numpy", "torch"])),
        after=draw(st.sampled_from(["none", "row", "vectorized"])),
        text_out=draw(st.booleans()),
        model_format=draw(st.sampled_from(["onnx", "onnx", "python"])),
        in_process=draw(st.booleans()),
        calls=tuple(draw(st.lists(values, min_size=2, max_size=4))),
    )


ISSUE_33 = Case(column="text", shape=(8,), before="none", module="sum", examples="row",
                example_type="torch", after="none", text_out=True, model_format="onnx",
                in_process=False, calls=("hello world", "hi", ""))
"""The issue's shape of pipeline: a text's vector [8] into a module that reduces it, whose
per-row result (a scalar) is served with reshape, over BLS."""


# -- the property ------------------------------------------------------------------------------
def test_generated_pipelines_are_refused_before_writing_or_served_as_in_process(
        triton_server, tmp_path):
    print(f"hypothesis seed {SEED}: TRITON_BUILDER_HYPOTHESIS_SEED={SEED} runs these pipelines "
          "again")
    served = tmp_path / "served"
    served.mkdir()
    server = triton_server(served, extra_args=("--model-control-mode=explicit",))
    control = grpcclient.InferenceServerClient(server.grpc_url)
    numbers = itertools.count()
    outcomes: list[str] = []

    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=PHASES,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=cases())
    @example(case=ISSUE_33)
    def check(case: Case) -> None:
        number = next(numbers)
        built = tmp_path / f"built-{number}" / "models"
        refusal = REFUSALS.get(case.examples)
        try:
            pipeline, name = make_pipeline(case, number)
            build_pipeline_model(pipeline, built, name=f"p{number}", in_process=case.in_process)
        except PipelineError as error:
            assert refusal is not None, f"refused a valid pipeline: {error}"
            assert f"model operator 'm{number}'" in str(error) and refusal in str(error), error
            assert not built.parent.exists() or not any(built.parent.iterdir()), \
                "a refused pipeline wrote files"
            outcomes.append(f"refused ({case.examples})")
            return
        assert refusal is None, f"the mistake {case.examples!r} was not refused"
        _serve_and_compare(control, server.grpc_url, built, served, pipeline, f"p{number}",
                           case.calls)
        outcomes.append(f"served ({case.column}, {case.module}, {case.examples}, "
                        f"{case.model_format}, {'in process' if case.in_process else 'BLS'})")

    try:
        check()
    except BaseException as error:
        raise AssertionError(f"hypothesis seed {SEED} (TRITON_BUILDER_HYPOTHESIS_SEED={SEED} "
                             f"runs these pipelines again): {error}") from error
    finally:
        print("\n".join(outcomes))
    assert any(o.startswith("served") for o in outcomes), outcomes


def _serve_and_compare(control: grpcclient.InferenceServerClient, url: str, built: Path,
                       served: Path, pipeline: Any, name: str, calls: tuple[Any, ...]) -> None:
    """Move the built models into the server's repository, load them (Triton reads each
    config.pbtxt here), compare every call with the in-process result, then unload them."""
    models = sorted(path.name for path in built.iterdir())
    for model in models:
        shutil.move(str(built / model), str(served / model))
    try:
        for model in sorted(models, key=lambda m: m == name):  # the pipeline last
            control.load_model(model)
        with Client(f"grpc://{url}/{name}") as client:
            for call in calls:
                check_same(client(call), pipeline(call), where=f"{name}({call!r})")
            for call, got in zip(calls, client.batch(list(calls)), strict=True):
                check_same(got, pipeline(call), where=f"{name}({call!r}) in a batch")
    finally:
        for model in models:
            control.unload_model(model)
            shutil.rmtree(served / model, ignore_errors=True)


@pytest.mark.parametrize("case", [ISSUE_33])
def test_the_generator_makes_the_issue_pipeline(case, tmp_path):
    """The explicit example is a pipeline of the issue's shape, valid and in process."""
    pipeline, name = make_pipeline(case, 0)
    assert pipeline("hello world")[1] == "HELLO WORLD" and name == "m0"

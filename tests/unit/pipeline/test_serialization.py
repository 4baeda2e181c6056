"""``pipe.pickle``: user code by value, model operators reduced, versions recorded and checked."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
import textwrap
import threading
import zipfile

import numpy as np
import pytest

from builder import ModelOp, PipelineError, SerializationError, pipe
from builder.pipeline.model_discovery import find_model_ops
from builder.pipeline.operators import BlsTarget
from builder.pipeline.serialization import check_serializable, dumps, round_trip, versions_record
from builder.pipeline.user_code import distributions_of, is_installed, user_modules
from builder.runtime.pipeline_model import PipelineLoadError, check_versions
from tests.support.tiny_models import affine_op

USER_MODULE = '''
import numpy as np

OFFSET = 100


def helper(x):
    return x + OFFSET


def shift(values):
    return np.asarray(values) + helper(0)


class Joiner:
    def __init__(self, separator):
        self.separator = separator

    def __call__(self, a, b):
        return f"{a}{self.separator}{b}"


class Shifter:
    def __call__(self, x):
        return x + OFFSET
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module in a directory of its own, importable now and gone from sys.path afterwards."""
    directory = tmp_path / "user_code"
    directory.mkdir()
    name = f"user_ops_{tmp_path.name.replace('-', '_')}"
    (directory / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(directory))
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


def _load_elsewhere(payload: bytes, tmp_path, blocked: list[str], script: str) -> str:
    """Unpickle in a fresh interpreter where ``blocked`` modules cannot be imported."""
    (tmp_path / "payload.pickle").write_bytes(payload)
    code = textwrap.dedent(f"""
        import pickle, sys
        for name in {blocked!r}:
            sys.modules[name] = None  # importing it now fails
        with open({str(tmp_path / 'payload.pickle')!r}, "rb") as file:
            obj = pickle.load(file)
    """) + textwrap.dedent(script)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_user_code_is_captured_by_value(user_module, tmp_path):
    p = (pipe.input("a", "b")
         .map("a", "shifted", user_module.shift)
         .map(("a", "b"), "joined", user_module.Joiner("-"))
         .output("shifted", "joined"))
    payload, _ = dumps(p)
    output = _load_elsewhere(payload, tmp_path, ["builder", user_module.__name__], """
        shifted, joined = obj([1, 2], "x")
        print(shifted.tolist(), joined)
        print(sorted(m for m in sys.modules if m.startswith(("torch", "onnx"))
                     and sys.modules[m]))
    """)
    assert output.splitlines() == ["[101, 102] [1, 2]-x", "[]"]


def test_two_classes_from_one_class_statement_stay_two_where_loaded(tmp_path):
    """Class tracker IDs are the same in every process, yet two classes of one name (here with
    different closures) must not be merged into one when the pipeline is loaded."""
    def adder(k):
        class Add:
            def __call__(self, x):
                return x + k
        return Add()

    p = pipe.input("x").map("x", "y", adder(1)).map("y", "z", adder(10)).output("z")
    assert p(1) == 12
    payload, _ = dumps(p)
    assert _load_elsewhere(payload, tmp_path, ["builder"], "print(obj(1))").strip() == "12"


def test_model_operators_are_pickled_without_their_module(tmp_path):
    op = affine_op()
    p = pipe.input("v").map("v", "y", op).output("y")
    target = BlsTarget("affine", "onnx", ("x",), ("output_0",), 8)
    _, restored = round_trip(p, {"affine": target})
    (served,) = restored.model_ops()
    assert served.module is None and served.example_inputs is None
    assert served.served == target
    assert served.pre([1, 2, 3, 4]).shape == (1, 4)
    assert op.module is not None and op.served is None  # the user's operator is untouched
    with pytest.raises(PipelineError, match="'affine' has no module and no runner"):
        restored([1, 2, 3, 4])


def test_checking_an_operator_leaves_its_class_as_it_was(user_module):
    """Unpickling in this process must not swap the live class's methods for copies bound to a
    copy of the module's globals: the operator would miss later changes to its module, and the
    next pickle would differ from the first (an unchanged pipeline rebuilt)."""
    shifter = user_module.Shifter()
    p = pipe.input("x").map("x", "y", shifter).output("y")
    first, _ = dumps(p)  # pickling caches __slotnames__ on the class (copyreg), and that is all
    before = dict(vars(user_module.Shifter))
    check_serializable(shifter, "shifter")
    assert {k: v for k, v in vars(user_module.Shifter).items() if v is not before.get(k)} == {}
    assert user_module.Shifter.__call__.__globals__ is vars(user_module)
    user_module.OFFSET = 7
    assert shifter(1) == 8
    user_module.OFFSET = 100
    assert dumps(p)[0] == first


def test_an_operator_that_cannot_be_pickled_is_named():
    lock = threading.Lock()
    p = pipe.input("x").map("x", "y", lambda x: lock and x, name="locked").output("y")
    with pytest.raises(SerializationError) as error:
        check_serializable(p.nodes[0].op, p.nodes[0].label)
    assert str(error.value).startswith(
        "operator 'locked' (map x -> y) cannot be serialized into pipe.pickle: TypeError:")
    assert "lock" in str(error.value)


def test_versions_record_names_the_installed_libraries_the_pickle_imports(user_module):
    p = pipe.input("a").map("a", "b", user_module.shift).output("b")
    _, referenced = dumps(p)
    record = versions_record(referenced)
    assert record["python"].split(".")[:2] == [str(v) for v in sys.version_info[:2]]
    assert set(record["libraries"]) == {"numpy", "cloudpickle"}
    assert record["libraries"]["numpy"] == importlib.metadata.version("numpy")
    json.dumps(record)


@pytest.mark.parametrize("top", ["numpy", "torch", "onnxruntime", "PIL", "yaml", "google",
                                 "cloudpickle", "no_such_module"])
def test_distributions_of_agrees_with_the_full_scan(top):
    """The quick lookup (the distribution named like the module) gives what reading every
    installed distribution's files gives, also for modules named unlike their distribution."""
    expected = importlib.metadata.packages_distributions().get(top, [])
    assert sorted(distributions_of(top)) == sorted(expected)
    assert expected or top == "no_such_module"


def test_version_check_at_load_time():
    here = {"python": ".".join(map(str, sys.version_info[:3])),
            "implementation": sys.implementation.name,
            "libraries": {"numpy": importlib.metadata.version("numpy")}}
    assert check_versions(here) == []
    with pytest.raises(PipelineLoadError, match=r"written by Python 3\.99\.0 .* same Python "
                                                r"minor version"):
        check_versions({**here, "python": "3.99.0"})
    with pytest.raises(PipelineLoadError, match=r"not installed .*: no-such-dist==1\.0"):
        check_versions({**here, "libraries": {"no-such-dist": "1.0"}})
    warnings = check_versions({**here, "libraries": {"numpy": "0.0.1"}})
    assert warnings == [f"pipe.pickle was written with numpy 0.0.1; this server has "
                        f"{importlib.metadata.version('numpy')}"]


# -- finding model operators wherever they hide ---------------------------------------------
DECODER = affine_op(name="global_decoder")


def _uses_global(x):
    return DECODER(x)


class _WithClassAttribute:
    model = affine_op(name="class_attribute")

    def __call__(self, x):
        return self.model(x)


class _Loop:
    def __init__(self, step):
        self.step = step

    def __call__(self, x):
        return self.step(x)


def test_model_operators_are_found_inside_other_operators():
    direct = affine_op(name="direct")
    in_attribute = affine_op(name="in_attribute")
    in_closure = affine_op(name="in_closure")
    in_partial = affine_op(name="in_partial")
    in_list = affine_op(name="in_list")

    def closure(x):
        return in_closure(x)

    found = find_model_ops([
        direct, _Loop(in_attribute), closure, functools.partial(_Loop.__call__, _Loop(in_partial)),
        _Loop([in_list]), _uses_global, np.add, _WithClassAttribute(),
    ])
    assert [op.name for op in found] == [
        "direct", "in_attribute", "in_closure", "in_partial", "in_list", "global_decoder",
        "class_attribute"]


def test_two_model_operators_with_one_name_are_refused():
    first, second = affine_op(name="same"), affine_op(name="same")
    with pytest.raises(PipelineError, match="two different model operators are named 'same'"):
        pipe.input("v").map("v", "a", first).map("v", "b", _Loop(second)).output("a", "b")


def test_a_model_op_is_an_ordinary_operator_in_the_pipeline():
    op = affine_op()
    assert isinstance(op, ModelOp)
    p = pipe.input("v").map("v", "y", op).output("y")
    np.testing.assert_allclose(p([1, 2, 3, 4]), op([1, 2, 3, 4]))


def test_a_users_own_by_value_registration_survives_the_build(user_module):
    import cloudpickle

    cloudpickle.register_pickle_by_value(user_module)
    try:
        dumps(pipe.input("a").map("a", "b", user_module.shift).output("b"))
        assert user_module.__name__ in cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES
    finally:
        cloudpickle.unregister_pickle_by_value(user_module)
    dumps(pipe.input("a").map("a", "b", user_module.shift).output("b"))
    assert user_module.__name__ not in cloudpickle.cloudpickle._PICKLE_BY_VALUE_MODULES


def test_an_unchanged_pipeline_pickles_to_the_same_bytes_every_time(user_module):
    """The first pickle of a class by value caches ``__slotnames__`` on it; a build must not
    depend on whether it is the first (else unchanged pipelines would rebuild their image)."""
    def build():
        return (pipe.input("a", "b").map(("a", "b"), "joined", user_module.Joiner("-"))
                .output("joined"))

    first, _ = dumps(build())
    second, _ = dumps(build())
    assert first == second


def test_vectorized_operators_and_their_caches_load_where_their_module_is_not(tmp_path):
    """The image example's pre-processing (``vectorized``, with a cache of resize taps) runs
    where neither ``builder`` nor ``pipelines`` can be imported, and the cache pickles empty:
    what ran before the build does not change ``pipe.pickle``."""
    from pipelines.image_classification import example_image, preprocess
    from pipelines.imaging import decode_image

    p = (pipe.input("image").map("image", "rgb", decode_image).map("rgb", "pixels", preprocess)
         .output("pixels"))
    first, _ = dumps(p)
    p.batch([example_image(1), example_image(2, height=20, width=30)])
    payload, _ = dumps(p)
    assert payload == first
    (tmp_path / "image.png").write_bytes(example_image(3))
    output = _load_elsewhere(payload, tmp_path, ["builder", "pipelines"], """
        with open("image.png", "rb") as file:
            data = file.read()
        results = obj.batch([data, data])
        print(results[0].shape, results[0].dtype, bool((results[0] == results[1]).all()))
    """)
    assert output.strip() == "(3, 32, 32) float32 True"
    np.testing.assert_allclose(p(example_image(3)), preprocess(decode_image(example_image(3))))


def test_a_pipeline_pickles_alike_after_an_instance_of_a_class_it_names_was_pickled():
    """A class pickled by value carries the ``__slotnames__`` copyreg caches on it when an
    instance of it is first pickled: a pipeline that names the class (here in an isinstance)
    without holding an instance pickled otherwise after another pickle had held one — two
    builds of one pipeline, two images (CI: the platforms test after the Hugging Face ones)."""

    class Marker:
        pass

    class Checks:
        def __call__(self, value):
            return isinstance(value, Marker) or float(value) * 2

    pipeline = pipe.input("x").map("x", "y", Checks()).output("y").with_example(1.0)
    before, _ = dumps(pipeline)
    dumps(Marker())
    after, _ = dumps(pipeline)
    assert after == before


def _wheel(directory, name: str, source: str):
    """A one-module wheel, as a package index serves one (pip writes the RECORD on install)."""
    wheel = directory / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{name}.py", source)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n"
                                           f"{info}/RECORD,,\n")
    return wheel


def test_a_library_pip_installed_into_a_directory_on_the_path_is_installed_not_user_code(
        tmp_path, monkeypatch):
    """``pip install --target DIR`` with DIR on ``PYTHONPATH`` (a machine whose site-packages is
    not writable; the GPU tier's lent machine brings numpy so): the library is installed, so
    pickled by reference. Before, it was taken for user code and pickled by value — numpy so
    carried failed (``cannot pickle 'classmethod_descriptor'``). The same file in a plain
    directory, with no distribution's RECORD beside it, stays user code."""
    source = "def double(x):\n    return 2 * x\n"
    target, plain = tmp_path / "site", tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--target", str(target), str(_wheel(tmp_path, "targetlib", source))],
                   check=True, capture_output=True, timeout=120)
    plain.mkdir()
    (plain / "plainlib.py").write_text(source)
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.syspath_prepend(str(plain))
    try:
        installed, own = importlib.import_module("targetlib"), importlib.import_module("plainlib")
        assert is_installed("targetlib") and "targetlib" not in user_modules()
        assert not is_installed("plainlib") and "plainlib" in user_modules()
        p = pipe.input("x").map("x", "y", installed.double).map("y", "z", own.double).output("z")
        payload, _ = dumps(p)
        (tmp_path / "payload.pickle").write_bytes(payload)
        loaded = subprocess.run(
            [sys.executable, "-c", "import pickle, sys; sys.modules['targetlib'] = None; "
             "pickle.load(open('payload.pickle', 'rb'))"],
            capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert "import of targetlib halted" in loaded.stderr, loaded.stderr  # by reference
    finally:
        sys.modules.pop("targetlib", None)
        sys.modules.pop("plainlib", None)


def test_loading_a_pickle_where_it_was_made_leaves_the_classes_and_the_next_pickle_alone(
        user_module):
    """A plain ``pickle.loads`` of a pipeline in the process that defined it (a user looking at
    their ``pipe.pickle``, a test) resolves its classes to the live ones: it must not set copies
    of their methods onto them, or the next build pickles those copies and makes a new image."""
    import pickle

    from pipelines.text_embedding import pipeline as text_embedding

    shifter = user_module.Shifter()
    p = pipe.input("x").map("x", "y", shifter).output("y")
    targets = {op.name: BlsTarget(op.name, "onnx", ("x",), ("output_0",), 8)
               for op in text_embedding.model_ops()}
    first, _ = dumps(p)
    text_first, _ = dumps(text_embedding, targets)
    before = dict(vars(user_module.Shifter))
    loaded = pickle.loads(first)
    pickle.loads(text_first)
    assert {k: v for k, v in vars(user_module.Shifter).items() if v is not before.get(k)} == {}
    assert loaded(1) == p(1)
    assert dumps(p)[0] == first
    assert dumps(text_embedding, targets)[0] == text_first

"""The CMake each python_backend branch requires, from its ``cmake_minimum_required``.

The stub's build stage brings its own CMake (:mod:`builder.bridge.cmake_wheel`); the version
it pins must be at least what every branch the compile route can take asks for, and below 4
(CMake 4 refuses the ``cmake_minimum_required`` below 3.5 that dependencies of the older branches
still declare). The table below is what the pin is chosen from.

Sources: ``python_backend/CMakeLists.txt`` of the ``git archive`` tarballs in
``../shared/triton-sources`` (python_backend r22.12, r23.05, r24.10, r24.12, r25.11: read, and
re-read by ``tests/unit/bridge/test_cmake_pin.py``). The branches not kept there follow the rule
read from the branches upstream (``../shared/REFERENCE.md``): 3.17 up to r25.02, 3.31.8 from
r25.08. r25.03 to r25.07 were read neither here nor there; a branch's requirement only grows, so
theirs lies between 3.17 and 3.31.8, which a pin satisfying r25.08 satisfies too.
"""

from __future__ import annotations

from builder.base.releases import version_key

# first branch, its cmake_minimum_required, where that value comes from
CMAKE_REQUIRED_FROM: tuple[tuple[str, str, str], ...] = (
    ("r21.02", "3.17", "read from python_backend r22.12, r23.05, r24.10 and r24.12 "
                       "(../shared/triton-sources); r21.02–r25.02 by REFERENCE.md's rule"),
    ("r25.03", "3.31.8", "not read: between 3.17 (r25.02) and 3.31.8 (r25.08); the larger is "
                         "assumed"),
    ("r25.08", "3.31.8", "read from python_backend r25.11 (../shared/triton-sources); r25.08 "
                         "onward by REFERENCE.md's rule"),
)


def cmake_required(branch: str) -> str:
    """The CMake python_backend ``branch`` (``r24.12``) requires (:data:`CMAKE_REQUIRED_FROM`)."""
    key = version_key(branch.removeprefix("r"))
    rows = [required for first, required, _ in CMAKE_REQUIRED_FROM
            if version_key(first.removeprefix("r")) <= key]
    if not rows:
        raise ValueError(f"python_backend {branch} is older than every branch the CMake table "
                         f"knows (from {CMAKE_REQUIRED_FROM[0][0]})")
    return rows[-1]


def newest_requirement() -> str:
    """The largest ``cmake_minimum_required`` of any branch in the table."""
    return max((required for _, required, _ in CMAKE_REQUIRED_FROM), key=version_key)

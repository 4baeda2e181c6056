"""Naming the layers of a restamped image's history (no engine needed)."""

from __future__ import annotations

from builder.engine.image_config import LAYER_COMMENT, _named, layer_name

BASE = [{"created_by": "/bin/sh -c #(nop) ADD file:abc in / "},
        {"created_by": '/bin/sh -c #(nop)  CMD ["bash"]', "empty_layer": True}]
BUILT = [
    {"created_by": "/bin/sh -c #(nop) COPY dir:1f in / "},
    {"created_by": "/bin/sh -c #(nop) COPY dir:2e in / "},
    {"created_by": "/bin/sh -c #(nop)  EXPOSE 8000", "empty_layer": True},
    {"created_by": "/bin/sh -c #(nop)  USER 1000:1000", "empty_layer": True},
    {"created_by": "/bin/sh -c id -u triton || useradd triton"},
    {"created_by": "/bin/sh -c #(nop) COPY dir:3d in / "},
    {"created_by": '/bin/sh -c #(nop)  LABEL a="b"', "empty_layer": True},
]


def test_the_builds_layer_steps_are_named_in_order_and_the_bases_left_as_they_are():
    named = _named(BASE + BUILT, len(BASE), ["environment", "weights of encoder", "user",
                                             "code"])
    assert named[:2] == BASE
    comments = [layer_name(entry.get("comment")) for entry in named[2:]]
    assert comments == ["environment", "weights of encoder", None, None, "user", "code", None]
    assert named[2]["comment"] == LAYER_COMMENT + "environment"
    assert "comment" not in BUILT[0], "the history given is not changed"


def test_no_name_is_given_when_the_steps_and_the_names_do_not_match():
    history = BASE + BUILT
    assert _named(history, len(BASE), ["environment", "code"]) == history
    assert _named(history, len(BASE), []) == history


def test_a_comment_not_ours_names_no_layer():
    assert layer_name("buildkit.dockerfile.v0") is None
    assert layer_name(None) is None

"""Dockerfiles rendered from the jinja2 templates in ``dockerfiles/``.

Templates run in a sandbox with strict undefined variables, and every value that reaches a
Dockerfile line passes a filter that refuses what could start another instruction:

* ``sh`` — shell-quote a value for a ``RUN`` line;
* ``json`` — a JSON string, for exec-form ``CMD``/``ENTRYPOINT``;
* ``value`` — a double-quoted ``LABEL``/``ENV`` value: backslash, ``"`` and ``$`` escaped the way
  the Dockerfile parser unescapes them (Docker expands ``$`` there), anything else kept as is;
* ``label_key`` — a label key: letters, digits, ``.``, ``_``, ``/``, ``-``;
* ``word`` — an image reference, path or user name that must be one plain token;
* ``path`` — an absolute path inside the image, one plain token;
* ``comment`` — free text for a ``#`` comment line (one line).

A newline in any value is rejected outright: it is the one way to inject a build step.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from importlib import resources
from typing import Any

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

from builder.errors import TritonBuilderError


class DockerfileError(TritonBuilderError, ValueError):
    """A value cannot be placed in a Dockerfile safely."""


def render(template: str, **values: Any) -> str:
    """Render ``dockerfiles/<template>`` with ``values``."""
    return _environment().get_template(template).render(**values)


def template_source(template: str) -> str:
    """The text of ``dockerfiles/<template>`` (part of an image's content hash)."""
    return (resources.files("builder.dockerfiles") / template).read_text()


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    """One environment per process: it keeps compiled templates (reloaded when a file changes)."""
    directory = resources.files("builder.dockerfiles")
    environment = ImmutableSandboxedEnvironment(
        loader=FileSystemLoader(str(directory)),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    environment.filters.update(sh=_shell_quote, json=_json_string, value=_value, word=_word,
                               path=_path, label_key=_label_key, comment=_single_line)
    return environment


_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+=,-]*$")
_PATH = re.compile(r"^/[A-Za-z0-9_./@+=,-]*$")
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def _single_line(value: object) -> str:
    text = str(value)
    if "\n" in text or "\r" in text:
        raise DockerfileError(f"a Dockerfile value may not contain a newline: {text!r}")
    return text


def _shell_quote(value: object) -> str:
    return shlex.quote(_single_line(value))


def _json_string(value: object) -> str:
    return json.dumps(_single_line(value))


def _value(value: object) -> str:
    text = _single_line(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _label_key(value: object) -> str:
    text = _single_line(value)
    if not _LABEL_KEY.fullmatch(text):
        raise DockerfileError(f"not a label key: {text!r}")
    return text


def _word(value: object) -> str:
    text = _single_line(value)
    if not _WORD.match(text):
        raise DockerfileError(f"not a plain image name, path or word: {text!r}")
    return text


def _path(value: object) -> str:
    text = _single_line(value)
    if not _PATH.match(text) or ".." in text.split("/"):
        raise DockerfileError(f"not a plain absolute path: {text!r}")
    return text

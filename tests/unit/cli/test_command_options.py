"""The build commands' options: one per library keyword, each with the library's default."""

from __future__ import annotations

import typer

from builder.cli import app
from builder.cli.command_options import KEYWORD_OF, build_keywords, library_default
from builder.job import BuildOptions, build_options
from builder.job.build_options import KEYWORDS


def _parameters(name: str) -> dict:
    command = typer.main.get_command(app).commands[name]
    return {parameter.name: parameter for parameter in command.params}


def test_every_option_of_image_is_a_library_keyword_with_its_default():
    """No default is a copy: changing the library's changes the command's."""
    parameters = _parameters("image")
    mapped = {name: KEYWORD_OF.get(name, name) for name in parameters}
    own = {name for name, keyword in mapped.items() if keyword not in KEYWORDS}
    assert own == {"pipeline", "tag", "push"}, own  # the command's own, not build options
    for name, keyword in mapped.items():
        if name in own:
            continue
        default = parameters[name].default
        converted = build_keywords({name: list(default) if isinstance(default, tuple)
                                    else default})[keyword]
        assert converted == library_default(keyword), (name, default)


def test_the_defaults_of_the_commands_build_the_librarys_default_options():
    values = {name: parameter.default for name, parameter in _parameters("image").items()
              if name not in ("pipeline", "tag", "push")}
    values = {name: list(value) if isinstance(value, tuple) else value
              for name, value in values.items()}
    assert build_options(**build_keywords(values)) == BuildOptions()


def test_the_build_command_shares_the_options_it_has_in_common_with_image():
    build, image = _parameters("build"), _parameters("image")
    for name in set(build) & set(image):
        assert build[name].default == image[name].default, name
        assert build[name].help == image[name].help, name


def test_values_become_keywords():
    assert build_keywords({"max_request_mb": 2.5, "pytorch_index": "none", "env": [],
                           "requirement": ["numpy"], "drain_seconds": 2.0}) == {
        "max_request_bytes": 5 * 1024 * 1024 // 2, "pytorch_index": None, "env_specs": (),
        "requirements": ("numpy",), "drain_s": 2.0}


def test_each_option_is_documented_once_where_the_library_documents_it():
    """The command's help is the options field's own (``metadata["help"]``), a note on how the
    command line says it aside."""
    import dataclasses

    for name, parameter in _parameters("image").items():
        keyword = KEYWORD_OF.get(name, name)
        if keyword not in KEYWORDS:
            continue
        group, field_name = KEYWORDS[keyword]
        kind = type(getattr(BuildOptions(), group)) if group else BuildOptions
        (found,) = [f for f in dataclasses.fields(kind) if f.name == field_name]
        assert parameter.help.startswith(found.metadata["help"]), name

"""The build commands' options: one per library keyword, each with the library's default."""

from __future__ import annotations

import ast
import inspect

import typer

from builder.cli import app
from builder.cli.command_options import KEYWORD_OF, build_keywords, library_default
from builder.job import BuildOptions, build_options
from builder.job.build_options import KEYWORDS
from tests.support.paths import REPO_ROOT


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


def _deploy_parameters(name: str) -> dict:
    group = typer.main.get_command(app).commands["deploy"]
    return {parameter.name: parameter for parameter in group.commands[name].params}


def test_the_deploy_commands_take_their_defaults_from_the_options_they_build():
    """``deploy swarm`` and ``deploy k8s`` with no option build the library's default options
    (issue 68: they repeated ten of ``SwarmOptions``' defaults and four of the Kubernetes ones as
    literals)."""
    from builder.deploy.kubernetes import KubernetesOptions
    from builder.deploy.swarm import STACK, SwarmOptions, deploy_swarm

    swarm = {name: parameter.default for name, parameter in _deploy_parameters("swarm").items()}
    assert SwarmOptions(
        replicas=swarm["replicas"], shm_size=swarm["shm_size"], publish=swarm["publish"],
        ports=(swarm["http_port"], swarm["grpc_port"], swarm["metrics_port"]),
        health_interval_s=swarm["health_interval"], health_retries=swarm["health_retries"],
        update_delay_s=swarm["update_delay"]) == SwarmOptions()
    assert swarm["name"] == STACK
    assert swarm["wait"] == inspect.signature(deploy_swarm).parameters["wait"].default
    k8s = {name: parameter.default for name, parameter in _deploy_parameters("k8s").items()}
    assert KubernetesOptions(**{name: k8s[name] for name in (
        "name", "namespace", "replicas", "min_replicas", "max_replicas")}) == KubernetesOptions()


def test_no_command_option_writes_a_default_of_its_own():
    """A number or a string as a ``typer.Option``'s default in a command module is a copy of a
    library default (issue 68: deploy, serve, base, tune, push and doctor repeated theirs; the
    flags of a command's own are ``None`` or a bool)."""
    literals = []
    for path in sorted((REPO_ROOT / "builder" / "cli").glob("*.py")):
        literals += [
            f"{path.name}:{call.lineno}: {ast.unparse(call)[:60]}"
            for call in ast.walk(ast.parse(path.read_text()))
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "typer.Option"
            and call.args and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, (int, float, str))
            and not isinstance(call.args[0].value, bool)]
    assert literals == []


def test_the_other_commands_defaults_are_the_library_calls_they_stand_for():
    from builder.base.cpu import build_cpu_base
    from builder.base.os_image import debian_os_image
    from builder.doctor import run_checks
    from builder.push.docker_push import push_image
    from builder.tune import tune
    from builder.verify.container import TRITON_PORTS, ServingContainer

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    serve = {name: p.default for name, p in _parameters("serve").items()}
    assert (serve["http_port"], serve["grpc_port"], serve["metrics_port"]) == TRITON_PORTS
    assert serve["timeout"] == default(ServingContainer.start, "timeout")
    assert _parameters("push")["retries"].default == default(push_image, "retries")
    assert _parameters("doctor")["cuda"].default == default(run_checks, "cuda")
    tuned = {name: p.default for name, p in _parameters("tune").items()}
    for name in ("minutes", "queue_policy", "measurement_ms", "max_concurrency"):
        assert tuned[name] == default(tune, name), name
    group = typer.main.get_command(app).commands["base"]
    base_os = {p.name: p.default for p in group.commands["os"].params}
    base_cpu = {p.name: p.default for p in group.commands["cpu"].params}
    assert base_os["suite"] == default(debian_os_image, "suite")
    assert base_os["platform"] == str(default(debian_os_image, "platform"))
    assert base_cpu["python_version"] == default(build_cpu_base, "python_version")
    assert base_cpu["platform"] == str(default(build_cpu_base, "platform"))


def test_the_deploy_options_are_documented_once_where_the_options_objects_define_them():
    """``deploy swarm --replicas`` and ``SwarmOptions.replicas`` are one question: the help is
    the field's own (``metadata["help"]``), as ``image``'s is its options field's."""
    import dataclasses

    from builder.deploy.kubernetes import KubernetesOptions
    from builder.deploy.swarm import SwarmOptions

    for command, options, fields in (
            ("swarm", SwarmOptions, {"replicas": "replicas", "shm_size": "shm_size",
                                     "publish": "publish", "health_interval": "health_interval_s",
                                     "health_retries": "health_retries",
                                     "update_delay": "update_delay_s"}),
            ("k8s", KubernetesOptions, {name: name for name in (
                "name", "namespace", "replicas", "min_replicas", "max_replicas")})):
        parameters = _deploy_parameters(command)
        documented = {each.name: each.metadata.get("help") for each in dataclasses.fields(options)}
        for parameter, field_name in fields.items():
            assert documented[field_name], (options.__name__, field_name)
            assert parameters[parameter].help == documented[field_name], (command, parameter)

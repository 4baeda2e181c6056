"""Console scripts lose the build directory from their shebang, and RECORD says what ships."""

from __future__ import annotations

import csv
import io

from builder.environment.portable_scripts import (
    PORTABLE_SHEBANG,
    drop_venv_command,
    make_scripts_portable,
    record_hash,
)

BODY = b"import sys\nfrom tool import main\nsys.exit(main())\n"


def _venv(root, shebang: bytes):
    site = root / "lib" / "python3.11" / "site-packages"
    (site / "tool-1.0.dist-info").mkdir(parents=True)
    (root / "bin").mkdir()
    script = root / "bin" / "tool"
    script.write_bytes(shebang + BODY)
    (site / "tool.py").write_text("def main(): return 0\n")
    rows = [["../../../bin/tool", record_hash(script.read_bytes()), str(script.stat().st_size)],
            ["tool.py", record_hash(b"def main(): return 0\n"), "21"],
            ["tool-1.0.dist-info/RECORD", "", ""]]
    text = io.StringIO()
    csv.writer(text).writerows(rows)  # pip's dialect: \r\n
    (site / "tool-1.0.dist-info" / "RECORD").write_bytes(text.getvalue().encode())
    return site, script


def test_a_shebang_naming_the_build_directory_is_rewritten_and_recorded(tmp_path):
    venv = tmp_path / "build-7f3a" / "venv"
    site, script = _venv(venv, b"#!" + str(venv).encode() + b"/bin/python\n")
    assert make_scripts_portable(site, venv) == [script]
    assert script.read_bytes() == PORTABLE_SHEBANG + b"\n" + BODY
    record = (site / "tool-1.0.dist-info" / "RECORD").read_bytes()
    assert record.count(b"\r\n") == 3
    first = next(csv.reader(io.StringIO(record.decode())))
    assert first[1:] == [record_hash(script.read_bytes()), str(len(script.read_bytes()))]
    assert b"tool.py," in record


def test_pips_long_path_wrapper_is_rewritten_too(tmp_path):
    venv = tmp_path / ("x" * 120) / "venv"
    wrapper = (b"#!/bin/sh\n'''exec' " + str(venv).encode() + b'/bin/python "$0" "$@"\n'
               b"' '''\n")
    site, script = _venv(venv, wrapper)
    make_scripts_portable(site, venv)
    assert script.read_bytes() == PORTABLE_SHEBANG + b"\n" + BODY


def test_two_build_directories_give_the_same_files(tmp_path):
    shipped = []
    for name in ("build-1", "build-22"):
        venv = tmp_path / name / "venv"
        site, script = _venv(venv, b"#!" + str(venv).encode() + b"/bin/python\n")
        make_scripts_portable(site, venv)
        shipped.append((script.read_bytes(),
                        (site / "tool-1.0.dist-info" / "RECORD").read_bytes()))
    assert shipped[0] == shipped[1]


def test_a_script_of_another_interpreter_is_left_alone(tmp_path):
    venv = tmp_path / "venv"
    site, script = _venv(venv, b"#!/usr/bin/python3\n")
    assert make_scripts_portable(site, venv) == []
    assert script.read_bytes().startswith(b"#!/usr/bin/python3\n")


def test_the_venv_command_line_is_dropped(tmp_path):
    (tmp_path / "pyvenv.cfg").write_text(
        "home = /usr/bin\nversion = 3.11.2\ncommand = /usr/bin/python3 -m venv /tmp/b-1/venv\n")
    drop_venv_command(tmp_path)
    assert (tmp_path / "pyvenv.cfg").read_text() == "home = /usr/bin\nversion = 3.11.2\n"

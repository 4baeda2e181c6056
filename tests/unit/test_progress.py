"""Build progress: plain lines where there is no terminal, a bar where there is one."""

from __future__ import annotations

import io

from builder.progress import BuildProgress

LOG = ["Step 1/3 : FROM base", " ---> abc", "Step 2/3 : COPY models/ /models/",
       " ---> Using cache", "Step 3/3 : LABEL a=b", "Successfully built def"]


def test_without_a_terminal_every_line_is_printed_as_it_comes():
    stream = io.StringIO()
    with BuildProgress("building x", stream=stream) as progress:
        for line in LOG:
            progress(line)
    printed = stream.getvalue().splitlines()
    assert printed == ["building x", *LOG]
    assert progress.steps == 3 and progress.cached_steps == 1


def test_on_a_terminal_the_steps_drive_a_bar():
    stream = io.StringIO()
    with BuildProgress("building x", stream=stream, plain=False) as progress:
        for line in LOG:
            progress(line)
    shown = stream.getvalue()
    assert "building x" in shown and "Successfully built" not in shown
    assert progress.steps == 3

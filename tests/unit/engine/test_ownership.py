"""Telling a live build from a dead one by its labels, with real processes: this one, one that
ran and exited, one killed but not yet reaped (a zombie), and this pid with another start time
(a reused pid)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

from builder.engine.ownership import BUILD_LABEL, BuildOwner, process_started

OWNER_OF_A_CHILD = ("import json; from builder.engine.ownership import BuildOwner; "
                    "print(json.dumps(BuildOwner.here().labels()))")


def test_this_process_owns_a_live_build():
    owner = BuildOwner.here()
    assert owner.alive() is True
    assert BuildOwner.from_labels(owner.labels()) == owner
    assert owner.build_id != BuildOwner.here().build_id  # a new build each time
    assert owner.container_name("verify") == f"triton-builder-verify-{owner.build_id}"


def test_a_builder_that_exited_is_gone():
    printed = subprocess.run([sys.executable, "-c", OWNER_OF_A_CHILD], capture_output=True,
                             text=True, check=True).stdout
    owner = BuildOwner.from_labels(json.loads(printed))
    assert owner is not None and owner.pid > 0
    assert owner.alive() is False


def test_a_killed_builder_not_yet_reaped_is_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = replace(BuildOwner.here(), pid=child.pid, started=process_started(child.pid))
        assert owner.alive() is True
        child.kill()
        deadline = time.monotonic() + 10
        while process_started(child.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert owner.alive() is False  # a zombie: dead, its pid still taken
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_not_the_builder():
    owner = BuildOwner.here()
    boot = owner.started.split("/")[0]
    assert replace(owner, started=f"{boot}/1").alive() is False
    assert replace(owner, started=f"another-boot/{owner.started.split('/')[1]}").alive() is False


def test_a_builder_on_another_host_cannot_be_judged_from_here():
    assert replace(BuildOwner.here(), host="elsewhere.example").alive() is None


def test_labels_without_an_owner_name_none():
    assert BuildOwner.from_labels({"ai.triton-builder.verification": "1"}) is None
    assert BuildOwner.from_labels({BUILD_LABEL: "x", "ai.triton-builder.build.pid": "?"}) is None

"""``tune`` end to end: the example pipelines served by a real tritonserver, loaded by NVIDIA's
perf_analyzer with their own examples, searched under a latency budget; the tuning file applied
to a rebuilt image. Bounded: 45 s of search per example (no run is begun that the runs so far
say cannot end within it), measured in windows of :data:`MEASUREMENT_MS`.

Searched without the budget's queue policy (``queue_policy=False``) so one pipeline instance is
a setting it may choose: under the policy every model keeps two instances at least
(``builder/repository/queue_policy.py``).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import TuneError, build_docker_image, tune
from builder.tune import read_tuning
from pipelines import image_classification, text_embedding

pytestmark = [pytest.mark.slow, pytest.mark.tritonserver]
BUDGET_MS = 50
MINUTES = 0.75
MEASUREMENT_MS = 500
"""perf_analyzer's window. Each load is measured until three windows agree, so the window sets
the pace: the image example's first setting (its load raised from 1 to 32 in flight) was
measured 25 s into the search on 1 s windows, 15 to 16 s on these, and its move to two
instances came 23 to 29 s in (38 s before): 45 s leave it about the margin a minute left 1 s
windows. At about 3,000 req/s a window still holds some 1,500 requests, and the two instances'
lead (23 to 36%) stays far beyond the run-to-run spread (5 to 8%)."""
IN_FLIGHT = 32
"""The most requests in flight, as in BENCHMARKS.md's sweep of the pipeline model's settings."""
TUNED_IMAGE = "triton-builder-test/tuned-image-classification:1"


def _moved_off_the_defaults_only_on_evidence(tuning) -> None:
    """The chosen setting is the defaults, or served more beyond the spread, or won the turns
    measured between the two."""
    chosen, default = tuning.chosen, tuning.default
    by_turns = [t.leader() for t in tuning.turns
                if {t.first, t.second} == {chosen.setting, default.setting}]
    assert chosen.setting == default.setting or chosen.rate > default.rate * (
        1 + tuning.spread) or by_turns == [chosen.setting], (
        f"moved off the defaults ({default.rate:.0f} req/s) to {chosen.setting.describe()} "
        f"({chosen.rate:.0f} req/s) within the spread {tuning.spread:.1%}, turns {by_turns}")


@pytest.fixture(scope="module")
def image_tuning(tmp_path_factory):
    where = tmp_path_factory.mktemp("tune-image")
    tuning = tune(image_classification.pipeline, BUDGET_MS, minutes=MINUTES, queue_policy=False,
                  measurement_ms=MEASUREMENT_MS, max_concurrency=IN_FLIGHT,
                  output=where / "tuning.json", report_dir=where / "report",
                  subject="pipelines/image_classification.py:pipeline")
    return tuning, where


def test_tune_of_the_image_example_keeps_the_defaults_or_takes_what_serves_more(image_tuning):
    """Which setting wins is a measurement (BENCHMARKS.md: two pipeline instances, 23 to 36%
    ahead on a quiet machine), not this test's to assert: on a slower machine, or beside the
    other worker's compiles, the 45 s may end before the search reaches two instances (a new
    machine at d8ef39e: one instance kept). What must hold whatever the machine: the chosen
    setting meets the budget, and it is the defaults unless it served more beyond the spread
    or won the turns between the two."""
    tuning, where = image_tuning
    chosen, default = tuning.chosen, tuning.default
    assert default.setting["pipeline"].instances == 1
    assert chosen.within_budget and chosen.p99_ms <= BUDGET_MS
    _moved_off_the_defaults_only_on_evidence(tuning)
    assert len({trial.setting for trial in tuning.trials}) >= 2, "the search measured only one"
    assert [name for name, _ in tuning.chosen.setting.models] == ["pipeline"], (
        "on the CPU base the classifier runs inside the pipeline model: nothing of its own to tune")
    assert read_tuning(where / "tuning.json").as_json() == tuning.as_json()
    table = (where / "report" / "tuning.md").read_text()
    assert table.count("\n| pipeline") == len(tuning.trials) >= 2
    assert (where / "report" / "tuning.png").stat().st_size > 0


def test_tune_keeps_the_text_examples_defaults_or_takes_what_serves_more_by_turns(tmp_path):
    """BENCHMARKS.md: at 32 in flight one instance without delay and two instances are within
    the spread of single runs, two ahead by 9 to 11% when measured by turns. Moving off the
    defaults needs a difference beyond the spread, or a lead the turns between the two show."""
    tuning = tune(text_embedding.pipeline, BUDGET_MS, minutes=MINUTES, queue_policy=False,
                  measurement_ms=MEASUREMENT_MS, max_concurrency=IN_FLIGHT)
    chosen = tuning.chosen
    assert chosen.within_budget and chosen.p99_ms <= BUDGET_MS
    _moved_off_the_defaults_only_on_evidence(tuning)


def test_the_tuning_file_applied_to_a_rebuild_gives_an_image_whose_config_carries_it(
        image_tuning, docker_client, cpu_base_image):
    """Applied whatever the search chose: where it kept the defaults, the file applied is the
    same tuning with its best other trial chosen, so that a rebuild that ignored the file (and
    took the defaults) would fail here."""
    measured, where = image_tuning
    tuning = measured if measured.chosen.setting != measured.default.setting else replace(
        measured, chosen=max((t for t in measured.trials
                              if t.setting != measured.default.setting),
                             key=lambda t: (t.within_budget, t.rate)))
    tuning_file = tuning.write(where / "applied-tuning.json")
    try:
        build_docker_image(image_classification.pipeline, TUNED_IMAGE, tuning=tuning_file)
        config = text_format.Parse(docker_client.containers.run(
            TUNED_IMAGE, ["cat", "/models/pipeline/config.pbtxt"], entrypoint=[],
            remove=True).decode(), mc.ModelConfig())
    finally:
        try:
            docker_client.images.remove(TUNED_IMAGE, force=True)
        except Exception:  # noqa: BLE001 - the build may have failed before tagging
            pass
    chosen = tuning.chosen.setting["pipeline"]
    assert tuning.chosen.setting != tuning.default.setting
    assert config.instance_group[0].count == chosen.instances
    assert config.max_batch_size == chosen.max_batch_size
    assert config.dynamic_batching.max_queue_delay_microseconds == chosen.max_queue_delay_us
    assert list(config.dynamic_batching.preferred_batch_size) == list(
        chosen.preferred_batch_size)
    assert not config.dynamic_batching.HasField("default_queue_policy"), (
        "tuned without the queue policy: the tuning sets no budget")


@pytest.mark.alongside  # no setting meets 0.05 ms, loaded or not
def test_tune_refuses_a_budget_no_setting_meets_and_says_the_best_p99_it_saw():
    with pytest.raises(TuneError, match=r"within a p99 of 0\.05 ms.*best p99 seen was"):
        tune(text_embedding.pipeline, 0.05, minutes=MINUTES, measurement_ms=500)


@pytest.mark.alongside  # no setting meets 0.05 ms, loaded or not
def test_the_command_line_refuses_it_too_as_one_error_line(tmp_path):
    run = subprocess.run(
        [str(Path(sys.executable).parent / "triton-builder"), "tune",
         "pipelines/text_embedding.py:pipeline",
         "--latency-budget-ms", "0.05", "--measurement-ms", "500",
         "--output", str(tmp_path / "tuning.json")],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(
        "error tuning: no setting serves within a p99 of 0.05 ms")
    assert not (tmp_path / "tuning.json").exists()


def test_tune_serves_a_built_image_with_its_repository_edited_per_setting(
        text_embedding_image, docker_client):
    """Served from the image: the two runs of its defaults alone already outlast the 12 s
    bound, so the search ends with them (one setting is what this test needs). Containers of
    the image there before it began are not the tune's."""
    others = _containers_of(docker_client, text_embedding_image)
    tuning = tune(text_embedding.pipeline, BUDGET_MS, minutes=0.2,
                  measurement_ms=MEASUREMENT_MS, max_concurrency=IN_FLIGHT,
                  image=text_embedding_image, client=docker_client)
    assert tuning.subject == text_embedding_image
    assert tuning.triton == docker_client.images.get(text_embedding_image).labels[
        "ai.triton-builder.triton-version"]
    assert not tuning.queue_policy, "the image was built without a budget"
    assert tuning.chosen.within_budget and len(tuning.trials) >= 1
    assert tuning.default.rate > 0
    left = _containers_of(docker_client, text_embedding_image) - others
    assert not left, f"a trial's container was left behind: {sorted(left)}"


def _containers_of(client, image: str) -> set[str]:
    return {container.id for container in client.containers.list(
        all=True, filters={"ancestor": image})}


def test_tune_refuses_an_image_of_another_pipeline(text_embedding_image, docker_client):
    with pytest.raises(TuneError, match="serves another pipeline"):
        tune(image_classification.pipeline, BUDGET_MS, minutes=0.3,
             image=text_embedding_image, client=docker_client)


def slow_letters(count: int):
    """``count`` letters, 25 ms apart: a stream's first item comes long before its end."""
    import time

    for i in range(int(count)):
        time.sleep(0.025)
        yield chr(ord("a") + i)


@pytest.mark.light  # the letters come 25 ms apart: the server mostly sleeps
def test_tune_holds_a_streaming_pipeline_to_its_budget_at_the_first_item(tmp_path):
    """A stream's budget bounds its first item, as served (the queue policy refuses a stream
    that would be late to it): ten letters take 250 ms whole, the first 25 ms, and a budget of
    100 ms is met by the first item only. Up to 4 in flight: at 8, each load's p99 is measured
    again and again before it holds still (a minute, against 45 s), and 4 already show it."""
    from builder import pipe

    letters = pipe.input("count").stream("count", "letter", slow_letters).output("letter")
    tuning = tune(letters.with_example(10), 100, minutes=0.3, measurement_ms=1000,
                  max_concurrency=4, output=tmp_path / "tuning.json")
    assert tuning.streams and tuning.chosen.within_budget
    assert 25 <= tuning.default.p99_ms <= 100 and 25 <= tuning.chosen.p99_ms <= 100
    assert read_tuning(tmp_path / "tuning.json").latency_of == "first item"

"""``tune``: search the settings a pipeline serves best with on this machine, under a latency
budget, and write them to a tuning file that ``image --tuning`` applies."""

from __future__ import annotations

from pathlib import Path

import typer

from builder.cli.app import app, console, log_line, run_step
from builder.cli.command_options import PIPELINE, parameter_default
from builder.cli.pipeline_loading import load_pipeline
from builder.tune import tune as run_tune


@app.command()
def tune(
    pipeline: str = PIPELINE,
    latency_budget_ms: float = typer.Option(
        ..., min=0.001, help="The p99 a request may take, at the pipeline's input."),
    minutes: float = typer.Option(parameter_default(run_tune, "minutes"), min=0.1,
                                  help="The longest the search may run."),
    output: Path = typer.Option(Path("tuning.json"), dir_okay=False,
                                help="The tuning file to write."),
    report: Path = typer.Option(None, file_okay=False,
                                help="A directory for the table of every setting tried "
                                     "(tuning.md) and the chart (tuning.png)."),
    queue_policy: bool = typer.Option(
        parameter_default(run_tune, "queue_policy"),
        help="Search under the queue policy the budget implies (what the tuned build serves "
             "with: two instances at least)."),
    measurement_ms: int = typer.Option(parameter_default(run_tune, "measurement_ms"), min=200,
                                       help="perf_analyzer's measurement window."),
    max_instances: int = typer.Option(None, min=1,
                                      help="Most instances of a model (default: the CPUs)."),
    image: str = typer.Option(
        None, help="Serve this built image of the pipeline (its Triton, its environment) "
                   "instead of this machine's tritonserver."),
    max_concurrency: int = typer.Option(
        parameter_default(run_tune, "max_concurrency"), min=1,
        help="Most requests in flight: the most your clients send."),
) -> None:
    """Serve a pipeline on this machine's tritonserver, drive it with perf_analyzer on its own
    examples and search instances, batch sizes and queue delays for the most requests/s within
    the latency budget.

    Example: triton-builder tune pipelines/image_classification.py:pipeline
    --latency-budget-ms 50 --minutes 5 --output tuning.json --report tuning/
    """
    from builder.tune.tuning_report import summary

    pipe = run_step("loading the pipeline", lambda: load_pipeline(pipeline))
    tuning = run_step("tuning", lambda: run_tune(
        pipe, latency_budget_ms, minutes=minutes, output=output, report_dir=report,
        queue_policy=queue_policy, measurement_ms=measurement_ms, max_instances=max_instances,
        max_concurrency=max_concurrency, image=image,
        subject=image or pipeline, log=log_line))
    console.print(summary(tuning))
    print(output)

"""The queries the README shows are the module's, each once (the e2e test runs them against a
real Prometheus: tests/e2e/test_prometheus.py)."""

from __future__ import annotations

from pathlib import Path

from builder.deploy import metrics_queries

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_shows_every_query_as_the_module_defines_it():
    text = README.read_text()
    for what, query in metrics_queries.QUERIES.items():
        assert f"# {what}\n{query}\n" in text, what


def test_the_adapters_queue_query_is_the_readmes_with_its_templates():
    adapter = metrics_queries.queue_ms_per_request("{<<.LabelMatchers>>}", "<<.GroupBy>>", "2m")
    assert adapter == (metrics_queries.QUEUE_MS_PER_REQUEST
                       .replace("by (model)", "by (<<.GroupBy>>)")
                       .replace("_us[", "_us{<<.LabelMatchers>>}[")
                       .replace("_success[", "_success{<<.LabelMatchers>>}[")
                       .replace(f"[{metrics_queries.WINDOW}]", "[2m]"))

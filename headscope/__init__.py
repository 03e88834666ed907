"""headscope: find out what each attention head of a real pretrained transformer does.

The public surface, in the order data flows::

    model  = headscope.load_model("smollm2-135m")        # or load_model(hf, tok)
    probes = headscope.default_probes(model, seed=0)     # token ids, saved with the run
    result = headscope.scan(model, probes)               # one streaming forward per batch
    result.scores                                        # tidy pandas table
    headscope.save_run(result, "runs/smollm2")           # scores.csv, metadata.json, ...
    headscope.heatmap(result.scores, "induction")        # matplotlib Figure

To score a pattern you extracted yourself, call a metric on it::

    headscope.score_pattern(pattern, "previous_token", causal=True)   # [batch, head] scores

How the package is layered. The folders are the layers: each line below imports only from lines
above it (no cycles, counting imports inside functions; ``tests/test_layers.py`` reads this table
and checks every import, the functions' bodies included). Each subpackage's docstring lists its
modules::

    errors         one exception type, did-you-mean, how messages name settings
    result, files, uncertainty   the result schema and the version; writing files safely (atomic,
                   never a user's); bootstrap intervals
    settings       the one settings base every command's settings derive from; shared field groups
    catalog        what every score name means (data: figures and pages read it, not the code)
    models/        where weights come from, the attention seam, the Model, load_model
    metrics/       what a head does: one module per behaviour, registered from the catalog
    probes/        the inputs as token ids: pairs, repeat, long prose, needles, default probes
    engines/       how attention is read: fused, blocked, hooks (a registry); the kernel; extraction
    effects/       causal effects: exact ablation, attribution patching, counterfactual patching
    circuits/      weights-based head scores; path patching; head classes; the edge graph (EAP)
    census/        the head census's parts: syntax, no-op, successor, copy suppression, rare word
    scale/         a scan's batches sharded over Ray actors
    report/        tables, figures, the HTML page (never the model)
    rundir/        the run directory: atomic, --force rules, signals, load
    scanner/       a scan's settings, example patterns, the whole scan as one function
    apps/          show, compare, kvplan, sweep, patch, circuit, discover: the other commands
    cli/           the headscope command: one file per subcommand, wiring only

Heavy imports (torch, transformers) happen only when these are first used.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from headscope.result import __version__

_BY_MODULE = {
    "headscope.errors": ("HeadscopeError",),
    "headscope.models.loading": ("load_model",),
    "headscope.models.model": ("Model",),
    "headscope.models.sources": ("resolve",),
    "headscope.result": ("Probe", "ScanResult", "matrix"),
    "headscope.probes.pairs": ("load_pairs", "text_probe", "repeat_probe"),
    "headscope.scanner.config": ("ScanConfig", "ScanSettings"),
    "headscope.scanner.runner": ("default_probes", "scan", "scan_to_dir"),
    "headscope.engines.extract": ("score_probe",),
    "headscope.scanner.scoring": ("score_pattern",),
    "headscope.metrics": ("PatternBatch", "Metric", "REGISTRY", "get_metric", "register"),
    "headscope.engines.registry": ("engine_names", "get_engine"),
    "headscope.rundir.store": ("save_run", "load_run"),
    "headscope.report.tables": ("top_heads", "relabel"),
    "headscope.report.figures": ("heatmap", "summary_figure", "save_figures"),
    "headscope.apps.patch": ("patch",),
    "headscope.apps.circuit": ("circuit",),
    "headscope.apps.discover": ("discover",),
    "headscope.probes.tasks": ("Task",),
}
_EXPORTS = {name: module for module, names in _BY_MODULE.items() for name in names}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headscope' has no attribute '{name}'")


def _scan_result_html(result) -> str:
    return import_module("headscope.report.html").summary_html(result)


def _register_notebook_display() -> None:
    """In a running IPython (a notebook), show a ScanResult as an HTML summary, not a dataclass
    dump."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = (
        ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    )
    if shell is not None and hasattr(shell, "display_formatter"):
        html = shell.display_formatter.formatters.get("text/html")
        if html is not None:
            html.for_type_by_name("headscope.result", "ScanResult", _scan_result_html)


_register_notebook_display()


if TYPE_CHECKING:  # pragma: no cover
    from headscope.apps.circuit import circuit  # noqa: F401
    from headscope.apps.discover import discover  # noqa: F401
    from headscope.apps.patch import patch  # noqa: F401
    from headscope.engines.extract import score_probe  # noqa: F401
    from headscope.engines.registry import engine_names, get_engine  # noqa: F401
    from headscope.errors import HeadscopeError  # noqa: F401
    from headscope.metrics import REGISTRY, Metric, PatternBatch, get_metric, register  # noqa: F401
    from headscope.models.loading import load_model  # noqa: F401
    from headscope.models.model import Model  # noqa: F401
    from headscope.models.sources import resolve  # noqa: F401
    from headscope.probes.pairs import load_pairs, repeat_probe, text_probe  # noqa: F401
    from headscope.probes.tasks import Task  # noqa: F401
    from headscope.report.figures import heatmap, save_figures, summary_figure  # noqa: F401
    from headscope.report.tables import relabel, top_heads  # noqa: F401
    from headscope.result import Probe, ScanResult, matrix  # noqa: F401
    from headscope.rundir.store import load_run, save_run  # noqa: F401
    from headscope.scanner.config import ScanConfig, ScanSettings  # noqa: F401
    from headscope.scanner.runner import default_probes, scan, scan_to_dir  # noqa: F401
    from headscope.scanner.scoring import score_pattern  # noqa: F401

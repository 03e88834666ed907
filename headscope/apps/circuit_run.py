"""The run directory of ``headscope circuit``: written whole, read back, and the command's whole job
(:func:`circuit_to_dir`: every check before the model loads, nothing written unless the run
succeeds).

    OUT/
      path.csv          a row per (sender, receiver, estimator): effect, interval, delta
                        (:data:`headscope.circuits.path_table.PATH_COLUMNS`)
      composition.csv   Q/K/V composition of every head pair with its null (z, percentile)
      agreement.csv     per single head receiver: Spearman rho of composition z against |path
                        effect|, the top-k overlap and its chance level
      classes.csv       IOI: every head's evidence, its class and the rule it passed
      evidence.csv      IOI: the scan scores the classes read (measured or given)
      baseline.csv      clean and corrupt metric with intervals; share correct
      tokens.jsonl      one line per pair: clean and corrupt ids, answer and wrong, positions
      metadata.json     model, source, weights sha256, task, settings, seed, versions, timings,
                        the cost in forwards, the files
      circuit.png       the diagram (heads with a class as nodes, path effects as edges)
      agreement.png     composition z against path effect, a panel per receiver
      report.html       the page (:mod:`headscope.report.circuit_page`), from the files above
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from headscope.apps.circuit import CircuitResult
from headscope.apps.settings import CircuitSettings
from headscope.errors import HeadscopeError

REPORT = "report.html"


def save_circuit(
    result: CircuitResult, out: str | Path, *, figures: bool = True, figure_formats=None, **options
) -> Path:
    """Write ``result`` to the run directory ``out`` (module docstring), published whole
    (:func:`headscope.rundir.store.write_run`); an existing ``out`` is replaced only with
    ``force`` and only when it is a circuit run (or empty). ``options``:
    :func:`~headscope.rundir.store.write_run`'s ``force``, ``say`` and ``started``."""
    from headscope.rundir.kinds import CIRCUIT
    from headscope.rundir.store import write_csv, write_run

    def tables(tmp: Path) -> None:
        write_csv(result.path, tmp / "path.csv")
        write_csv(result.baseline, tmp / "baseline.csv")
        for name in ("composition", "agreement", "classes"):
            table = getattr(result, name)
            if table is not None and len(table.columns):
                write_csv(table, tmp / f"{name}.csv")
        if result.per_pair.get("evidence") is not None:
            write_csv(result.per_pair["evidence"], tmp / "evidence.csv")
        result.tokens.write_jsonl(tmp / "tokens.jsonl")

    def page(tmp: Path) -> None:
        from headscope.report.circuit_page import write_circuit_page

        write_circuit_page(tmp, figures=figures)

    base = result.baseline.set_index("prompt")
    record = dict(
        result.metadata,
        run_kind="circuit",
        baseline={p: base.loc[p].drop("task").to_dict() for p in base.index},
    )
    draw = (lambda tmp: _figures(result, tmp, figure_formats)) if figures else None
    result.metadata = write_run(out, CIRCUIT, tables, record, figures=draw, page=page, **options)
    return Path(out)


def _figures(result: CircuitResult, tmp: Path, formats) -> None:
    import pandas as pd

    from headscope.report.circuit_figures import save_circuit_figures

    classes = (
        result.classes
        if result.classes is not None
        else pd.DataFrame(columns=["head_name", "layer", "head", "class", "rule"])
    )
    save_circuit_figures(
        classes,
        result.path,
        result.composition,
        result.agreement,
        tmp,
        result.metadata.get("n_layers", 0),
        threshold=result.metadata.get("settings", {}).get("edge_threshold", 0.05),
        model=result.model,
        formats=formats,
    )


def load_circuit(path: str | Path) -> CircuitResult:
    """Read a circuit run directory back (tables, tokens, metadata; no per-pair values)."""
    from headscope.probes.tasks import TokenizedTask
    from headscope.rundir.kinds import CIRCUIT
    from headscope.rundir.store import read_record, read_table

    path = Path(path)
    meta = read_record(path, CIRCUIT)
    tokens = TokenizedTask.read_jsonl(path / "tokens.jsonl", meta.get("task", ""), meta["metric"])
    classes = read_table(path, "classes.csv", ("class", "rule"))
    if classes is not None:
        classes[["class", "rule"]] = classes[["class", "rule"]].fillna("")
    return CircuitResult(
        meta.get("task", ""),
        meta.get("model", ""),
        meta.get("metric", ""),
        read_table(path, "path.csv", ("receiver_position",)),
        read_table(path, "baseline.csv", ("prompt",)),
        read_table(path, "composition.csv"),
        read_table(path, "agreement.csv", ("top_composition", "top_path")),
        classes,
        tokens,
        meta,
        {"evidence": read_table(path, "evidence.csv")},
    )


def circuit_to_dir(model_name, task, out: str | Path, config=None, **options) -> CircuitResult:
    """``headscope circuit``: check everything, load ``model_name``, run, save the run to ``out``
    (:func:`headscope.apps.runs.task_run_to_dir`, whose keywords ``options`` are: ``scan``,
    ``tokenizer``, ``force``, ``figures``, ``say``, ``figure_formats`` and any setting).

    Refused with one line before the model loads: a setting, the task file or kit, ``--scan``, an
    ``out`` that may not be written, the model name, and (when the model's shape is on disk: a
    packaged model, a folder, a cached snapshot) a receiver or sender outside the model or a sender
    not below its receiver. Refused before any forward pass: an encoder, a task whose pairs fail
    their own checks (an answer that is not one token, pairs of different lengths), a receiver's
    position the task lacks, a scan of another model. Nothing is written unless the run succeeds.
    """
    from headscope.apps.runs import task_run_to_dir
    from headscope.rundir.kinds import CIRCUIT

    return task_run_to_dir(
        CIRCUIT, CircuitSettings, _circuit_work, save_circuit, model_name, task, out, config,
        before_loading=_before_loading, **options,
    )  # fmt: skip


def _before_loading(config: CircuitSettings, model_name) -> None:
    from headscope.models.sources import model_shape

    shape = model_shape(str(model_name)) if isinstance(model_name, (str, Path)) else None
    if shape is not None:  # layers and heads from the config on disk: no weights loaded
        check_receivers(Shape(str(model_name), *shape), config)


def _circuit_work(model, task, config, pattern, say) -> CircuitResult:
    from headscope.apps.circuit import circuit, tokenized
    from headscope.circuits.evidence import scores_evidence

    tt = tokenized(model, task, config)  # the task's own checks, before any forward
    check_receivers(model, config, tt)
    evidence = scores_evidence(pattern) if pattern is not None else None
    return circuit(model, tt, config, evidence=evidence, say=say)


@dataclass(frozen=True)
class Shape:
    """What the checks of senders and receivers read of a model: its name and shape."""

    name: str
    n_layers: int
    n_heads: int


def check_receivers(model, config: CircuitSettings, tt=None) -> None:
    """Every named receiver and sender inside ``model`` (a loaded model or a :class:`Shape`),
    each sender below its receiver, and (with the tokenized task ``tt``) each receiver's position
    in the task: one line for the first that is not."""
    from headscope.circuits.path_patching import check_paths
    from headscope.circuits.receivers import Receiver, parse_head

    receivers = [Receiver.parse(r) for r in config.receivers]
    senders = [parse_head(s) for s in config.senders]
    if not receivers:
        if senders:
            check_paths(model, senders, [Receiver("logits")])
        return
    batch = None
    if tt is not None:
        from headscope.effects.patching import make_batches

        batch = make_batches(tt, len(tt), model.pad_id)[0]
    for r in receivers:
        if senders:
            check_paths(model, senders, [r])
        elif r.kind != "logits" and r.layer == 0:
            _no_sender(r)
        else:
            check_paths(model, [(0, 0)], [r])
        if r.kind != "logits" and batch is not None:
            from headscope.effects.patching import position_masks

            position_masks(batch, r.position)


def _no_sender(r) -> None:
    raise HeadscopeError(
        f"Receiver {r.name} is in layer 0: no head lies below it; name a receiver in layer 1 or "
        "above."
    )

"""``headscope.circuit(model, task, ...)``: which head feeds which on a task, by path patching and
by the weights, held against each other (docs/circuits.md).

    result = headscope.circuit(model, "ioi")       # or a Task, a TokenizedTask, a .jsonl/.tsv file
    result.path          # a row per (sender, receiver, estimator): effect, interval, delta
    result.composition   # Q/K/V composition of every head pair, z against a random-sender null
    result.agreement     # per receiver: senders ranked by composition and by path patching
    result.classes       # IOI: every head's evidence and the class its rule gives

Receivers (``receivers``; :mod:`headscope.circuits.receivers`): named ones, or by default

* IOI (the ``ioi`` kit, or any task with positions IO, S1, S2 and END): the logits first; the
  name movers and negative name movers from their direct effects and END -> IO attention; then
  every name mover's query at END (one receiver each, and all at once: the group whose path effect
  defines S-inhibition); every S-inhibition head's value at S2 (induction and duplicate-token
  heads); every induction head's key at S1+1 (previous-token heads). Each class comes from the
  previous one (:mod:`headscope.circuits.classes`, rules and thresholds).
* any other task: the logits, then the query at END of the :data:`TOP_DIRECT` heads with the
  largest |direct effect|.

Every receiver gets every head below it as a sender (or the named ``senders``), patched exactly
(:mod:`headscope.circuits.path_patching`) and, unless ``attribution="none"``, estimated to first
order beside it (:mod:`headscope.circuits.path_attribution`). Agreement is computed for every
single head receiver: its senders' composition z of the receiver's kind against their |exact path
effect| (:mod:`headscope.circuits.agreement`).

The pattern and copying scores the classes need come from ``evidence`` (a table such as
:func:`headscope.circuits.evidence.scores_evidence` reads from a scan) or are measured now.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headscope.apps.settings import CircuitSettings
from headscope.errors import HeadscopeError
from headscope.result import timed

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

TOP_DIRECT = 5
COPYING_SEQUENCES = 8  # repeat sequences the copying scores read (50 positions each)
#: agreement.csv's names for :func:`headscope.circuits.agreement.rank_agreement`'s keys
AGREEMENT_NAMES = {
    "n": "n_senders",
    "rho": "spearman",
    "rho_low": "spearman_ci_low",
    "rho_high": "spearman_ci_high",
    "rho_p": "spearman_p",
    "k": "top_k",
    "overlap_p": "p_overlap",
    "top_a": "top_composition",
    "top_b": "top_path",
}
IOI_POSITIONS = ("IO", "S1", "S2", "END")
CircuitConfig = CircuitSettings  # the name it had


@dataclass
class CircuitResult:
    """What :func:`circuit` returns (and :func:`headscope.apps.circuit_run.load_circuit` reads back,
    without ``per_pair``)."""

    task: str
    model: str
    metric: str
    path: pd.DataFrame
    baseline: pd.DataFrame
    composition: pd.DataFrame | None
    agreement: pd.DataFrame | None
    classes: pd.DataFrame | None
    tokens: object
    metadata: dict = field(default_factory=dict)
    #: ``{estimator: {(sender, receiver name): m_patched [pair]}}``, ``m_clean``, ``m_corrupt``
    per_pair: dict = field(default_factory=dict, repr=False)

    def top(self, n: int = 10, receiver: str | None = None, estimator: str = "exact"):
        """The ``n`` paths with the largest |effect| (of one receiver, by name)."""
        t = self.path[self.path["estimator"] == estimator]
        if receiver is not None:
            t = t[t["receiver"] == receiver]
        return t.reindex(t["effect"].abs().sort_values(ascending=False).index).head(n)

    def heads(self, cls: str) -> list[tuple[int, int]]:
        """The heads of one class (IOI runs)."""
        from headscope.circuits.classes import heads_of

        return [] if self.classes is None else heads_of(self.classes, cls)


def tokenized(model, task, config: CircuitSettings):
    """The :class:`~headscope.probes.tasks.TokenizedTask` of what the user passed (as
    ``headscope.patch`` reads it; a kit draws ``n_pairs`` or :data:`N_PAIRS`), its provenance
    kept."""
    from headscope.apps.settings import CIRCUIT_PAIRS as N_PAIRS
    from headscope.probes.kits import tokenize_task

    return tokenize_task(
        task, model, config.metric, config.n_pairs, config.seed, config.templates,
        draw=config.n_pairs or N_PAIRS,
    )  # fmt: skip


def circuit(
    model,
    task,
    config: CircuitSettings | None = None,
    *,
    evidence: pd.DataFrame | None = None,
    say: Callable[[str], None] | None = None,
    **settings,
) -> CircuitResult:
    """Path patching, composition and (IOI) head classes of ``model`` on ``task`` (see the module
    docstring). ``config`` or keyword ``settings`` (the fields of
    :class:`~headscope.apps.settings.CircuitSettings`); ``evidence``: the scan scores of
    every head (``layer``, ``head``, ``induction``, ... :data:`~headscope.circuits.evidence.
    SCAN_EVIDENCE`), measured now when an IOI run needs them and none is given."""

    from headscope.apps.runs import check_model
    from headscope.circuits.receivers import Receiver, parse_head
    from headscope.effects.patch_table import baseline_table
    from headscope.effects.patching import make_batches
    from headscope.rundir.record import run_record

    config = CircuitSettings.configure(config, settings)
    say = say or (lambda _m: None)
    check_model(model)
    tt = tokenized(model, task, config)
    batches = make_batches(tt, config.batch_size, model.pad_id)
    runner = _Runner(model, tt, batches, config, say)
    timings: dict[str, float] = {}
    with timed(timings, "path_s"):
        explicit = [Receiver.parse(r) for r in config.receivers]
        senders = [parse_head(s) for s in config.senders] or None
        classes = None
        ioi = all(p in tt.positions for p in IOI_POSITIONS)
        if explicit:
            runner.run(explicit, senders)
        elif ioi:
            classes, evidence = _ioi(runner, model, tt, batches, config, evidence, senders, say)
        else:
            runner.run([Receiver("logits")], senders)
            direct = runner.effects("logits")
            top = sorted(((la, h) for (la, h) in direct if la > 0), key=lambda k: -abs(direct[k]))[
                :TOP_DIRECT
            ]
            runner.run([Receiver("q", la, h, "END") for la, h in top], senders)
    if config.attribution == "all":
        t1 = time.perf_counter()
        runner.attribute_all()
        timings["attribution_all_s"] = round(time.perf_counter() - t1, 3)
    path = runner.table()
    composition = agreement = None
    if config.composition:
        from headscope.circuits.composition import composition as composition_scores

        say(f"circuit: Q-, K- and V-composition of every head pair ({config.n_null} null draws)")
        t1 = time.perf_counter()
        composition = composition_scores(model, n_null=config.n_null, seed=config.seed)
        timings["composition_s"] = round(time.perf_counter() - t1, 3)
        agreement = agreement_of(path, composition, config)
    b, level, seed = config.bootstrap, config.ci, config.seed
    baseline = baseline_table(tt.name, tt.metric, runner.base, b, level, seed)
    meta = run_record(
        model,
        config,
        run_kind="circuit",
        task=tt.name,
        task_provenance=tt.provenance,
        metric=tt.metric,
        n_pairs=len(tt),
        receivers=list(dict.fromkeys(path["receiver"])),
        timings=timings,
        cost={
            "forwards": runner.cost.forwards,
            "full_forwards": round(runner.cost.full_forwards(len(tt), model.n_layers), 2),
            "one_at_a_time_full_forwards": 2 + 2 * runner.n_exact,
        },
        evidence=runner.evidence_source,
    )
    return CircuitResult(
        tt.name,
        model.name,
        tt.metric,
        path,
        baseline,
        composition,
        agreement,
        classes,
        tt,
        meta,
        {
            "estimates": runner.estimates,
            "evidence": evidence if classes is not None else None,
            **{f"m_{k}": v for k, v in runner.base.items()},
        },
    )


class _Runner:
    """Path patching of receivers as the run finds them, every result kept for the table."""

    def __init__(self, model, tt, batches, config: CircuitSettings, say):
        from headscope.circuits.path_patching import Cost

        self.model, self.tt, self.batches, self.config, self.say = model, tt, batches, config, say
        self.estimates: dict[str, dict] = {"exact": {}, "attribution": {}}
        self.base: dict = {}
        self.cost = Cost()
        self.n_exact = 0
        self.evidence_source = None

    def paths(self, targets, senders):
        from headscope.circuits.path_patching import check_paths, senders_below

        if senders is not None:
            return check_paths(self.model, senders, targets)
        below = senders_below(self.model, targets)
        out = []
        for t in targets:
            if not below[t]:
                raise HeadscopeError(
                    f"Receiver {t.name} is in layer 0: no head lies below it; name a receiver in "
                    "layer 1 or above."
                )
            out += check_paths(self.model, below[t], [t])
        return out

    def run(self, targets, senders=None) -> None:
        from headscope.circuits.path_attribution import path_attribution
        from headscope.circuits.path_patching import path_patching

        targets = [t for t in dict.fromkeys(targets) if t not in self.done]
        if not targets:
            return
        paths = self.paths(targets, senders)
        c, d = self.config, self.config.direction
        self.say(
            f"circuit: path patching {len(paths)} (sender, receiver) pairs into "
            f"{', '.join(t.name for t in targets)} ({len(self.tt)} pairs, {d})"
        )
        exact = path_patching(
            self.model,
            self.batches,
            len(self.tt),
            self.tt.metric,
            paths,
            d,
            c.freeze_mlps,
            baseline=self.base,
            cost=self.cost,
        )
        self.estimates["exact"].update(exact)
        self.n_exact += len(paths)
        if c.attribution != "none":
            est = path_attribution(
                self.model, self.batches, len(self.tt), self.tt.metric, paths, d, c.freeze_mlps
            )
            m0 = self.base["clean" if d == "noising" else "corrupt"]
            self.estimates["attribution"].update({k: m0 + v for k, v in est.items()})

    @property
    def done(self) -> set:
        return {r for _, r in self.estimates["exact"]}

    def effects(self, receiver_name: str) -> dict[tuple[int, int], float]:
        """``{sender: pooled exact effect}`` into one receiver (ratio of means, as the table)."""
        d = self.config.direction
        c, k = self.base["clean"].mean(), self.base["corrupt"].mean()
        gap = float(c - k)
        out = {}
        for (s, r), m in self.estimates["exact"].items():
            if r.name == receiver_name:
                mp = float(m.mean())
                out[s] = ((mp - float(k)) if d == "denoising" else (float(c) - mp)) / gap
        return out

    def attribute_all(self) -> None:
        """First-order estimates into every head's q, k and v from every earlier head."""
        from headscope.circuits.path_attribution import path_attribution
        from headscope.circuits.receivers import Receiver

        m, c = self.model, self.config
        targets = [
            Receiver(k, la, h)
            for la in range(1, m.n_layers)
            for h in range(m.n_heads)
            for k in ("q", "k", "v")
        ]
        paths = self.paths(targets, None)
        self.say(f"circuit: first-order estimates of {len(paths)} paths (every head pair)")
        est = path_attribution(
            m, self.batches, len(self.tt), self.tt.metric, paths, c.direction, c.freeze_mlps
        )
        m0 = self.base["clean" if c.direction == "noising" else "corrupt"]
        self.estimates["attribution"].update({k: m0 + v for k, v in est.items()})

    def table(self):
        from headscope.circuits.path_table import path_table

        c = self.config
        est = {k: v for k, v in self.estimates.items() if v}
        return path_table(
            self.tt.name,
            c.direction,
            self.model.n_layers,
            self.base["clean"],
            self.base["corrupt"],
            est,
            c.freeze_mlps,
            c.bootstrap,
            c.ci,
            c.seed,
        )


def _ioi(runner: _Runner, model, tt, batches, config, evidence, senders, say):
    """The IOI classes, each found from the previous ones (module docstring)."""
    import numpy as np
    import pandas as pd

    from headscope.circuits.classes import ClassRules, classify, heads_of, interval_columns
    from headscope.circuits.evidence import attention_between
    from headscope.circuits.receivers import Receiver, ReceiverGroup

    rules = ClassRules(config.direct, config.attention, config.copying, config.path, config.pattern)
    rules.validate()
    if evidence is None:
        evidence = scan_evidence(model, seed=config.seed, say=say)
        runner.evidence_source = "measured (scan_evidence)"
    else:
        runner.evidence_source = "given"
    L, H = model.n_layers, model.n_heads
    ev = pd.DataFrame({"layer": np.repeat(np.arange(L), H), "head": np.tile(np.arange(H), L)})
    ev = ev.merge(evidence, on=["layer", "head"], how="left", suffixes=("", "_scan"))
    runner.run([Receiver("logits")], senders)
    table = runner.table()
    direct = table[(table["receiver"] == "logits") & (table["estimator"] == "exact")]
    direct = direct.set_index(["sender_layer", "sender_head"])
    idx = list(zip(ev["layer"], ev["head"], strict=True))
    ev["direct_effect"] = [direct["effect"].get(k, np.nan) for k in idx]
    ev["direct_ci_low"] = [direct["ci_low"].get(k, np.nan) for k in idx]
    ev["direct_ci_high"] = [direct["ci_high"].get(k, np.nan) for k in idx]
    per_pair = attention_between(model, batches, len(tt), "END", "IO")  # [pair, layer, head]
    at = (ev["layer"].to_numpy(), ev["head"].to_numpy())
    ev["end_to_io"] = per_pair.mean(0).numpy()[at]
    lo, hi = _pair_interval(per_pair, config)
    ev["end_to_io_ci_low"], ev["end_to_io_ci_high"] = lo[at], hi[at]

    def group_step(cls, kind, position, column, only):
        heads = heads_of(classify(ev, rules, only), cls)
        heads = [(la, h) for la, h in heads if la > 0]
        if not heads:
            say(f"circuit: no {cls.replace('_', ' ')} heads, so no {column}")
            return
        members = tuple(Receiver(kind, la, h, position) for la, h in heads)
        group = ReceiverGroup(members, f"{cls}.{kind}@{position}")
        runner.run([group, *members], _below(senders, group))
        eff = runner.effects(group.name)
        ev[column] = [eff.get(k, np.nan) for k in idx]
        # the path table's interval of the same effect (bootstrap over pairs)
        rows = runner.table()
        rows = rows[(rows["receiver"] == group.name) & (rows["estimator"] == "exact")]
        rows = rows.set_index(["sender_layer", "sender_head"])
        low, high = interval_columns(column)
        ev[low] = [rows["ci_low"].get(k, np.nan) for k in idx]
        ev[high] = [rows["ci_high"].get(k, np.nan) for k in idx]

    base = ("name_mover", "negative_name_mover")
    group_step("name_mover", "q", "END", "path_to_name_movers_q", base)
    group_step("s_inhibition", "v", "S2", "path_to_s_inhibition_v", (*base, "s_inhibition"))
    group_step(
        "induction",
        "k",
        "S1+1",
        "path_to_induction_k",
        (*base, "s_inhibition", "induction", "duplicate_token"),
    )
    return classify(ev, rules), evidence


def _pair_interval(per_pair, config: CircuitSettings):
    """The percentile interval over pairs of a per-pair mean (``[pair, layer, head]`` -> two
    ``[layer, head]`` arrays), resampled as every other interval of the run (``config.bootstrap``
    draws of the pairs, ``config.ci``, ``config.seed``); NaN with no bootstrap."""
    import numpy as np
    import torch

    from headscope.uncertainty import bootstrap

    shape = tuple(per_pair.shape[1:])
    if config.bootstrap == 0:
        return np.full(shape, np.nan), np.full(shape, np.nan)
    b = bootstrap(
        per_pair.double(),
        torch.ones(per_pair.shape[0], dtype=torch.float64),
        resamples=config.bootstrap,
        level=config.ci,
        seed=config.seed,
    )
    return b.ci_low.numpy(), b.ci_high.numpy()


def scan_evidence(model, seed: int = 0, n_sequences: int = 16, say=None) -> pd.DataFrame:
    """``layer, head`` and the scores the classes read, measured now: the ``induction``,
    ``duplicate_token`` and ``previous_token`` scores of a scan of default probes (``n_sequences``
    each), and the OV-circuit ``copying`` and ``copy_suppression`` scores on its repeat probe
    (:data:`COPYING_SEQUENCES` of them at most)."""
    from headscope.circuits.copy_suppression import copy_suppression_scores
    from headscope.circuits.copying import copying_scores
    from headscope.circuits.evidence import PATTERN_METRICS, scores_evidence
    from headscope.scanner.runner import default_probes, scan

    say = say or (lambda _m: None)
    say(f"circuit: pattern and copying scores of every head ({n_sequences} sequences per probe)")
    probes = default_probes(model, n_prompts=n_sequences, seed=seed, metrics=PATTERN_METRICS)
    result = scan(model, probes, metrics=PATTERN_METRICS, seed=seed, bootstrap=0, null=False)
    table = scores_evidence(result.scores)
    repeat = next(p for p in probes if p.name == "repeat")
    n_ov = min(n_sequences, COPYING_SEQUENCES)  # a full-vocabulary readout per position and head
    copying = copying_scores(model, repeat, max_sequences=n_ov).score
    suppression = copy_suppression_scores(model, repeat, max_sequences=n_ov, resamples=50)
    table["copying"] = copying[table["layer"], table["head"]].numpy()
    table["copy_suppression"] = suppression.score[table["layer"], table["head"]].numpy()
    return table


def _below(senders, group):
    """The named senders that lie below a group (all of them when none are named)."""
    if senders is None:
        return None
    return [s for s in senders if s[0] < group.layer] or None


def agreement_of(path, composition, config: CircuitSettings):
    """Per single head receiver: its senders' composition z (of the receiver's kind) against their
    |exact path effect| (:func:`headscope.circuits.agreement.agreement_table`)."""
    import pandas as pd

    from headscope.circuits.agreement import agreement_table

    exact = path[(path["estimator"] == "exact") & (path["receiver_head"] >= 0)]
    if exact.empty:
        return pd.DataFrame()
    comp = composition.set_index(["receiver", "kind", "sender"])["z"]
    a, b, kinds = {}, {}, {}
    for name, sub in exact.groupby("receiver", sort=False):
        kind = sub["receiver_kind"].iloc[0]
        head = f"L{int(sub['receiver_layer'].iloc[0])}H{int(sub['receiver_head'].iloc[0])}"
        keys = [(head, kind, s) for s in sub["sender"]]
        z = comp.reindex(keys).to_numpy()
        a[name] = pd.Series(z, index=sub["sender"].to_numpy())
        b[name] = pd.Series(sub["effect"].abs().to_numpy(), index=sub["sender"].to_numpy())
        kinds[name] = kind
    k = min(config.top_k, min(len(s) for s in a.values()))
    table = agreement_table(a, b, k=k, seed=config.seed).rename(columns=AGREEMENT_NAMES)
    table.insert(1, "kind", [kinds[r] for r in table["receiver"]])
    for col in ("top_composition", "top_path"):
        table[col] = [" ".join(map(str, v)) for v in table[col]]
    return table

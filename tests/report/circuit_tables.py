"""Synthetic tables of a circuit run (``path.csv``, ``composition.csv``, ``agreement.csv``,
``classes.csv``, ``metadata.json``) in the columns ``headscope circuit`` writes, for the report
tests: a 4-layer x 3-head model with a hand-made IOI-like circuit.

Classed heads: L3H0 name_mover, L3H1 negative_name_mover, L2H0 and L2H2 s_inhibition, L1H1
induction, L0H2 previous_token. Unclassed: every other head (L0H0 has an empty class, L0H1 a
NaN one). The exact noising rows that qualify at the default threshold 0.05 are listed in
:data:`EDGES` (counted by hand); the rest are below it, leave or enter an unclassed head, are
attribution estimates, or are denoising rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

N_LAYERS, N_HEADS, N_PAIRS = 4, 3, 16
NAN = float("nan")

CLASSES = {
    (3, 0): ("name_mover", "direct_effect >= 0.1 and end_to_io >= 0.3 and copying > 0"),
    (3, 1): ("negative_name_mover", "direct_effect <= -0.1 and end_to_io >= 0.3"),
    (2, 0): ("s_inhibition", "path_to_name_movers_q >= 0.05"),
    (2, 2): ("s_inhibition", "path_to_name_movers_q >= 0.05"),
    (1, 1): ("induction", "induction >= 0.4 and path_to_s_inhibition_v >= 0.02"),
    (0, 2): ("previous_token", "previous_token >= 0.5 and path_to_induction_k >= 0.02"),
    (0, 0): ("", ""),
}

#: (sender, receiver, kind, effect): exact noising rows, the edges at threshold 0.05 marked True.
ROWS = [
    ("L3H0", "logits", "logits", 0.62, True),
    ("L3H1", "logits", "logits", -0.21, True),
    ("L2H0", "L3H0.q@END", "q", 0.18, True),
    ("L2H2", "L3H0.q@END", "q", 0.07, True),
    ("L2H0", "L3H1.q@END", "q", -0.06, True),
    ("L1H1", "L2H0.v@S2", "v", 0.09, True),
    ("L0H2", "L1H1.k@S2", "k", 0.05, True),  # exactly at the threshold: kept
    ("L0H2", "L1H1.q@S2", "q", 0.049, False),  # just below
    ("L2H1", "L3H0.q@END", "q", 0.30, False),  # the sender has no class
    ("L1H0", "L2H0.v@S2", "v", 0.25, False),  # the sender has no class
    ("L2H0", "L3H2.q@END", "q", 0.40, False),  # the receiver has no class
    ("L0H0", "L1H1.k@S2", "k", -0.30, False),  # empty class
    ("L0H1", "L1H1.k@S2", "k", 0.20, False),  # NaN class
    ("L2H2", "logits", "logits", -0.02, False),  # below
    ("L1H1", "L2H2.v@S2", "v", NAN, False),  # NaN effect
]
EDGES = [r for r in ROWS if r[4]]


def _split(name: str) -> tuple[int, int]:
    layer, head = name[1:].split("H")
    return int(layer), int(head)


def path_table(task: str = "ioi") -> pd.DataFrame:
    rows = []

    def add(sender, receiver, kind, effect, direction="noising", estimator="exact"):
        sl, sh = _split(sender)
        if kind == "logits":
            rl, rh, pos = N_LAYERS, -1, "END"
        else:
            rl, rh = _split(receiver.split(".")[0])
            pos = receiver.split("@")[1]
        rows.append(
            {
                "task": task,
                "direction": direction,
                "sender": sender,
                "sender_layer": sl,
                "sender_head": sh,
                "receiver": receiver,
                "receiver_kind": kind,
                "receiver_layer": rl,
                "receiver_head": rh,
                "receiver_position": pos,
                "effect": effect,
                "ci_low": effect - 0.03,
                "ci_high": effect + 0.04,
                "delta": -2.0 * effect,
                "delta_ci_low": -2.0 * effect - 0.1,
                "delta_ci_high": -2.0 * effect + 0.1,
                "estimator": estimator,
                "freeze_mlps": False,
                "n_pairs": N_PAIRS,
            }
        )

    for s, r, k, e, _ in ROWS:
        add(s, r, k, e)
    # not edges: the attribution estimates of the same pairs, and denoising rows
    for s, r, k, e, _ in ROWS[:4]:
        add(s, r, k, 0.9 if e == e else e, estimator="attribution")
        add(s, r, k, -0.8, direction="denoising")
    return pd.DataFrame(rows)


def classes_table() -> pd.DataFrame:
    rows = []
    for layer in range(N_LAYERS):
        for head in range(N_HEADS):
            cls, rule = CLASSES.get((layer, head), ("", ""))
            if (layer, head) == (0, 1):
                cls, rule = NAN, NAN  # a missing class reads as none
            row = {"head_name": f"L{layer}H{head}", "layer": layer, "head": head}
            row.update({"class": cls, "rule": rule})
            row.update(
                direct_effect=0.6 if (layer, head) == (3, 0) else -0.2 if layer == 3 else NAN,
                direct_ci_low=0.5 if (layer, head) == (3, 0) else NAN,
                direct_ci_high=0.7 if (layer, head) == (3, 0) else NAN,
                end_to_io=0.45 if layer == 3 else NAN,
                end_to_io_ci_low=0.41 if layer == 3 else NAN,
                end_to_io_ci_high=0.49 if layer == 3 else NAN,
                copying=0.8 if layer == 3 else NAN,
                path_to_name_movers_q=0.18 if layer == 2 else NAN,
                induction=0.55 if layer == 1 else NAN,
                duplicate_token=NAN,
                path_to_s_inhibition_v=0.09 if layer == 1 else NAN,
                previous_token=0.7 if layer == 0 else NAN,
                path_to_induction_k=0.05 if layer == 0 else NAN,
            )
            rows.append(row)
    return pd.DataFrame(rows)


def composition_table() -> pd.DataFrame:
    rows = []
    for rl in range(1, N_LAYERS):
        for rh in range(N_HEADS):
            for kind in ("q", "k", "v"):
                for sl in range(rl):
                    for sh in range(N_HEADS):
                        z = 4.5 if (sl, sh, rl, rh, kind) == (0, 2, 1, 1, "k") else (sh - 1) * 0.7
                        rows.append(
                            {
                                "sender": f"L{sl}H{sh}",
                                "sender_layer": sl,
                                "sender_head": sh,
                                "receiver": f"L{rl}H{rh}",
                                "receiver_layer": rl,
                                "receiver_head": rh,
                                "kind": kind,
                                "score": 0.1 + 0.02 * z,
                                "null_mean": 0.1,
                                "null_sd": 0.02,
                                "z": z,
                                "percentile": 1.0 if z > 2 else 0.5,
                                "n_null": 20,
                            }
                        )
    return pd.DataFrame(rows)


def agreement_table() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "receiver": "L1H1.k@S2",
                "kind": "k",
                "n_senders": 3,
                "spearman": 0.5,
                "spearman_ci_low": -0.5,
                "spearman_ci_high": 1.0,
                "top_k": 1,
                "overlap": 1,
                "overlap_chance": 1 / 3,
                "p_overlap": 1 / 3,
            },
            {
                "receiver": "L3H0.q@END",
                "kind": "q",
                "n_senders": 9,
                "spearman": 0.2,
                "spearman_ci_low": -0.3,
                "spearman_ci_high": 0.6,
                "top_k": 3,
                "overlap": 1,
                "overlap_chance": 1.0,
                "p_overlap": 0.6,
            },
        ]
    )


def metadata(task: str = "ioi") -> dict:
    return {
        "run_kind": "circuit",
        "model": "tiny-gpt2",
        "task": task,
        "n_pairs": N_PAIRS,
        "n_layers": N_LAYERS,
        "n_heads": N_HEADS,
        "settings": {"receivers": "auto", "edge_threshold": 0.05, "seeds": 20},
        "baseline": {"clean_logit_diff": 3.25, "corrupt_logit_diff": -0.5, "gap": 3.75},
        "files": ["path.csv", "composition.csv", "agreement.csv", "classes.csv"],
    }


def write_run(out: Path, task: str = "ioi") -> Path:
    """A circuit run directory with the five files."""
    out.mkdir(parents=True, exist_ok=True)
    path_table(task).to_csv(out / "path.csv", index=False)
    composition_table().to_csv(out / "composition.csv", index=False)
    agreement_table().to_csv(out / "agreement.csv", index=False)
    classes_table().to_csv(out / "classes.csv", index=False)
    (out / "metadata.json").write_text(json.dumps(metadata(task)))
    return out

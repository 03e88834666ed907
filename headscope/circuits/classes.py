"""Head classes of the IOI circuit (Wang et al. 2022), each by an explicit rule on measured
evidence.

The evidence of every head (columns of :data:`EVIDENCE`, NaN where not measured):

* ``direct_effect`` (``direct_ci_low`` / ``direct_ci_high``): path patching of the head into the
  logits (noising: the share of the clean-corrupt logit-difference gap destroyed);
* ``end_to_io`` (``end_to_io_ci_low`` / ``end_to_io_ci_high``): its mean attention from END to the
  indirect object's token (clean prompts), with a bootstrap interval over pairs;
* ``copying``: the scan's ``copying`` score (does its OV circuit raise the logit of the token it
  attends to) and ``copy_suppression`` (does it lower it);
* ``path_to_name_movers_q``: path patching of the head into every name mover's query at END at
  once (a receiver group);
* ``path_to_s_inhibition_v``: into every S-inhibition head's value at S2;
* ``path_to_induction_k``: into every induction head's key at S1+1 (the token after the first S);
  each of the three ``path_to_*`` columns with its interval beside it (``..._ci_low`` /
  ``..._ci_high``, the path table's bootstrap over pairs);
* ``induction``, ``duplicate_token``, ``previous_token``: the scan's pattern scores (repeat probe).

The rules (:class:`ClassRules`; every threshold a setting), applied in this order, a head taking
the first class whose rule it passes:

=======================  =====================================================================
``name_mover``           direct_effect >= direct and end_to_io >= attention and copying >= copying
``negative_name_mover``  direct_effect <= -direct and end_to_io >= attention
``s_inhibition``         path_to_name_movers_q >= path
``induction``            induction >= pattern and path_to_s_inhibition_v >= path
``duplicate_token``      duplicate_token >= pattern and path_to_s_inhibition_v >= path
``previous_token``       previous_token >= pattern and path_to_induction_k >= path
=======================  =====================================================================

Wang et al. found these classes in GPT-2 small by hand, with their own thresholds and by patching
the paths between classes they had already named; here each class is found from the previous ones
(name movers first), so a class with no members leaves the classes that depend on it empty, and
the rule each head passed is written beside its numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from headscope.catalog import CIRCUIT_CLASSES, CLASS_EVIDENCE, interval_columns  # noqa: F401
from headscope.errors import HeadscopeError

CLASSES, EVIDENCE = CIRCUIT_CLASSES, list(CLASS_EVIDENCE)
COLUMNS = ["head_name", "layer", "head", "class", "rule", *EVIDENCE]


@dataclass(frozen=True)
class ClassRules:
    """The thresholds of the rules in the module docstring."""

    direct: float = 0.05  # |direct effect|: share of the logit-difference gap
    attention: float = 0.1  # END -> IO attention
    copying: float = 0.5  # the scan's copying label threshold
    path: float = 0.05  # share of the gap through a receiver group
    pattern: float = 0.4  # induction / duplicate-token / previous-token score

    def validate(self) -> ClassRules:
        for name, v in asdict(self).items():
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise HeadscopeError(f"Class threshold {name} must be a number >= 0, got {v!r}.")
        return self

    def text(self, cls: str) -> str:
        """The rule of ``cls`` with this object's numbers."""
        d, a, c, p, q = self.direct, self.attention, self.copying, self.path, self.pattern
        return {
            "name_mover": f"direct_effect >= {d:g}, end_to_io >= {a:g}, copying >= {c:g}",
            "negative_name_mover": f"direct_effect <= -{d:g}, end_to_io >= {a:g}",
            "s_inhibition": f"path_to_name_movers_q >= {p:g}",
            "induction": f"induction >= {q:g}, path_to_s_inhibition_v >= {p:g}",
            "duplicate_token": f"duplicate_token >= {q:g}, path_to_s_inhibition_v >= {p:g}",
            "previous_token": f"previous_token >= {q:g}, path_to_induction_k >= {p:g}",
        }[cls]

    def passes(self, cls: str, row) -> bool:
        g = lambda k: row.get(k, np.nan)  # noqa: E731  NaN compares False: unmeasured never passes
        d, a, p, q = self.direct, self.attention, self.path, self.pattern
        return bool(
            {
                "name_mover": g("direct_effect") >= d
                and g("end_to_io") >= a
                and g("copying") >= self.copying,
                "negative_name_mover": g("direct_effect") <= -d and g("end_to_io") >= a,
                "s_inhibition": g("path_to_name_movers_q") >= p,
                "induction": g("induction") >= q and g("path_to_s_inhibition_v") >= p,
                "duplicate_token": g("duplicate_token") >= q and g("path_to_s_inhibition_v") >= p,
                "previous_token": g("previous_token") >= q and g("path_to_induction_k") >= p,
            }[cls]
        )


def classify(evidence: pd.DataFrame, rules: ClassRules, only=CLASSES) -> pd.DataFrame:
    """``evidence`` (a row per head: ``layer``, ``head`` and any of :data:`EVIDENCE`) with each
    head's ``class`` (the first of ``only``, in :data:`CLASSES` order, whose rule it passes; "" for
    none) and that ``rule``; columns :data:`COLUMNS`."""
    rules.validate()
    ev = evidence.copy()
    for col in EVIDENCE:
        if col not in ev:
            ev[col] = np.nan
    ev["head_name"] = [
        f"L{int(la)}H{int(h)}" for la, h in zip(ev["layer"], ev["head"], strict=True)
    ]
    classes, texts = [], []
    for row in ev.to_dict("records"):
        got = next((c for c in CLASSES if c in only and rules.passes(c, row)), "")
        classes.append(got)
        texts.append(rules.text(got) if got else "")
    ev["class"], ev["rule"] = classes, texts
    return ev[COLUMNS].sort_values(["layer", "head"]).reset_index(drop=True)


def heads_of(classes: pd.DataFrame, cls: str) -> list[tuple[int, int]]:
    """The ``(layer, head)`` of every head of class ``cls``."""
    sub = classes[classes["class"] == cls]
    return [(int(la), int(h)) for la, h in zip(sub["layer"], sub["head"], strict=True)]

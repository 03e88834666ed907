"""The head census (``headscope census``): the literature's head types, each part a function of
a :class:`~headscope.census.base.Context` returning rows of ``scores.csv`` (and lines of
``summary.md``, tables and records), registered below in the order they run. A new part is one
module here and one line in :data:`PARTS` (its scores: one entry each in
:data:`headscope.catalog.CENSUS`); :mod:`headscope.apps.census` runs them and writes the run.

==========  ========================================================================================
base        the context the parts share; rows of ``scores.csv``; per-sequence sums
syntax      Clark et al.'s syntax heads on silver parses, against the best fixed offset
noop        the [SEP] / BOS no-op test, the weight there, the whole-head mean ablation beside them
ov          successor heads and copy suppression, read through each head's OV circuit
rare_word   rare-word heads (Voita et al. 2019), with the chance of tied rarest keys
==========  ========================================================================================
"""

from headscope.census import noop, ov, rare_word, syntax
from headscope.census.base import SEQUENCES_FILE, Context, per_sequence_table

#: The parts by name, in the order they run (``--parts``: :data:`headscope.catalog.CENSUS_PARTS`
#: names them for the settings, which load no torch; tests/census checks the two agree).
PARTS = {
    "syntax": syntax.syntax_part,
    "noop": noop.noop_part,
    "successor": ov.successor_part,
    "copy_suppression": ov.copy_suppression_part,
    "rare_word": rare_word.rare_word_part,
}

__all__ = ["PARTS", "SEQUENCES_FILE", "Context", "per_sequence_table"]

"""What a reader sees: tables, figures and the HTML page, drawn from a result or a saved run, never
from the model.

=========  =========================================================================================
tables     the tidy table, labels, summaries (``summary.md``, what ``scan`` prints)
curves     values against a setting (budgets, steps, lengths): lines, error bars, bands, chance
figures    layer x head heatmaps, query x key patterns, the effect scatter (Figures, no pyplot)
html       ``report.html``: a run on one self-contained page
pattern_page  one head's (or layer's) pattern on a text as a self-contained page (``show --html``)
census_page   a head census on one self-contained page (``headscope census``), and its figures
patching   a patching run's heatmaps, per-position grid and direct-logit-attribution figure
patch_page  a patching run's ``report.html``: baseline, top heads, pattern scores beside effects
circuit_figures  a circuit run's diagram (a figure, and its SVG for the page) and agreement panels
circuit_page  a circuit run's ``report.html``: diagram, head classes, agreement, path effects
discover_figures  a discovery run's faithfulness curve and circuit, from its tables
discover_page  a discovery run's ``report.html``: the curve, CPR and CMD, top edges, agreement
icl_page   an ICL run's ``summary.md``, FV-against-induction scatter, ablation curves and page
kvplan     a KV plan's summary, figure and ``kvplan.md``, from its table
compare    runs side by side: the score distributions and the per-head difference figures
sweep      a sweep's figures, from its atlas alone
=========  =========================================================================================

Importing these loads no engine, effect, extraction or attention module (tested).
"""

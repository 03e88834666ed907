"""What the commands beyond ``scan`` do, as functions (the CLI only wires them): runs only; their
figures and pages live in :mod:`headscope.report`, their statistics in :mod:`headscope.uncertainty`.

===============  ================================================================================
settings         every command's settings but scan's (light: the commands' options are their fields)
show             one head's (or one layer's) pattern on a text, as a figure or a page
redraw           ``plot`` and ``report``: a saved run's figures and page drawn again from its files
compare          runs side by side: summary and per-head differences
kvplan           a KV-cache plan from a scan, checked by running the model (its page: report.kvplan)
sweep            many scans (models, checkpoints, settings, seeds) into one atlas
runs             what patch and circuit share: the model check, a scan beside the run, the driver
census           the head census of one model as a run directory (docs/census.md)
patch            counterfactual patching of every head on a task's prompt pairs, as a run directory
circuit          which head feeds which on a task: path patching, composition, IOI head classes
circuit_run      a circuit run's directory: written whole, read back, the command's whole job
discover         a task's circuit in the edge graph: every edge scored, exact edges, the curve
qk               why heads attend where they do: their logits split over component pairs, a run
icl              which heads carry in-context learning: FV heads beside induction, the ablations
===============  ================================================================================
"""

"""Head scores read from a head's circuit rather than from its pattern alone.

* :mod:`headscope.circuits.copying`: does the head's OV circuit raise the logit of the token it
  attends to (Olsson et al. 2022)? The ``copying`` rows of a scan.
* :mod:`headscope.circuits.value_weighted`: how much of the head's output (not of its attention
  weight) comes from position 0 (Kobayashi et al. 2020)? The ``value_sink`` rows of a scan.
* :mod:`headscope.circuits.ov`: what a head writes when it attends to one position, read at the
  attention seam (the model's own norms), and the readout it is read through (the head census).
* :mod:`headscope.circuits.successor`: successor heads (Gould et al. 2023): does the OV circuit map
  a token of an ordinal set to its successor?
* :mod:`headscope.circuits.copy_suppression`: copy suppression (McDougall et al. 2023): does the OV
  circuit lower the logit of the token it attends to (the mirror of ``copying``)?
* :mod:`headscope.circuits.composition`: Q-, K- and V-composition of an earlier head into a later
  one from the weights (Elhage et al. 2021), with a null of random senders.
* :mod:`headscope.circuits.agreement`: do two rankings of a receiver's senders agree (Spearman,
  top-k overlap against chance)?
* :mod:`headscope.circuits.receivers`: where a path ends, by name (``logits``, ``L9H1.q@END``),
  and groups of receivers (light: no torch).
* :mod:`headscope.circuits.path_patching`: path patching (Wang et al. 2022) of sender heads into
  receivers, exact, in as few forwards as the maths allows.
* :mod:`headscope.circuits.path_attribution`: the same to first order, for every pair at once.
* :mod:`headscope.circuits.path_table`: the tidy table of path effects with intervals over pairs.
* :mod:`headscope.circuits.evidence`: attention between named positions, scan scores per head.
* :mod:`headscope.circuits.classes`: the IOI head classes, each by an explicit rule.
* :mod:`headscope.circuits.faithfulness`: what a head set carries alone (every other head
  mean-ablated), against random sets of its size.
* :mod:`headscope.circuits.edge_graph`: the edge graph (writers, readers, who reads whom) and the
  modules each node lives in.
* :mod:`headscope.circuits.edge_runs`: one forward with each reader fed its own residual stream:
  edges cut, gradients read.
* :mod:`headscope.circuits.edge_scores`: every edge's EAP and EAP-IG score, exact edge patching.
* :mod:`headscope.circuits.edge_circuits`: circuits of edges, their faithfulness curve, CPR, CMD.
* :mod:`headscope.circuits.qk_attribution`: a head's attention logit split over pairs of
  components (query side x key side), knock-outs, subspaces.
* :mod:`headscope.circuits.qk_rules`: which query and key a head is decomposed at, and the null
  keys.
* :mod:`headscope.circuits.qk_summary`: QK tables over prompts: means, intervals, nulls.
"""

"""Head scores read from a head's circuit rather than from its pattern alone.

* :mod:`headscope.circuits.copying`: does the head's OV circuit raise the logit of the token it
  attends to (Olsson et al. 2022)? The ``copying`` rows of a scan.
* :mod:`headscope.circuits.value_weighted`: how much of the head's output (not of its attention
  weight) comes from position 0 (Kobayashi et al. 2020)? The ``value_sink`` rows of a scan.
"""

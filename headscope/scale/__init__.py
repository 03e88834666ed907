"""Scale-out: a scan's batches sharded over Ray actors (sweeps over models and checkpoints are
:mod:`headscope.apps.sweep`, above the scan).

* :mod:`headscope.scale.options` checks ``--ray``/``--workers`` before anything loads;
* :mod:`headscope.scale.shard` plans and merges shards (no Ray: testable anywhere);
* :mod:`headscope.scale.ray_scan` holds the Ray actors, one model replica each.

Ray is an optional extra (``pip install -e ".[ray]"``) and is imported only inside the functions
that need it, so ``import headscope`` never needs it.
"""

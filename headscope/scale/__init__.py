"""Scale-out: a scan's batches sharded over Ray actors, and sweeps over models and checkpoints.

* :mod:`headscope.scale.shard` plans and merges shards (no Ray: testable anywhere);
* :mod:`headscope.scale.ray_scan` holds the Ray actors, one model replica each;
* :mod:`headscope.scale.sweep` runs a sweep SPEC.toml: one run directory per job, one atlas.

Ray is an optional extra (``pip install -e ".[ray]"``) and is imported only inside the functions
that need it, so ``import headscope`` never needs it.
"""

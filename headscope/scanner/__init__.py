"""A whole scan as one function, and its settings (one object that flows down).

=========  =========================================================================================
config     :class:`~headscope.scanner.config.ScanSettings`: every setting, its default and its check
examples   the strongest heads' patterns on one example per probe (``views.npz``, for the page)
runner     :func:`~headscope.scanner.runner.scan` and :func:`~headscope.scanner.runner.scan_to_dir`
scoring    :func:`~headscope.scanner.scoring.score_pattern`: any metric on a pattern you extracted
=========  =========================================================================================
"""

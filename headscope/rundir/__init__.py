"""The run directory: written atomically, read back, never a folder headscope did not write.

=========  =========================================================================================
signals    Ctrl-C / SIGTERM raised where the program was, held during renames
store      save, load, the ``--force`` rules
=========  =========================================================================================
"""

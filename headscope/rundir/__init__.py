"""The run directory: written atomically, read back, never a folder headscope did not write.

=========  =========================================================================================
kinds      every kind of run directory in one table: command, format, main table, what it replaces
record     the one run record: model, source and sha256, special tokens, versions, settings, device
signals    Ctrl-C / SIGTERM raised where the program was, held during renames
store      the one writer (write_run) and reader of every command's run; a scan's save / load
=========  =========================================================================================
"""

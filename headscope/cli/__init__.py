"""The ``headscope`` command: one file per subcommand, wiring only (no maths, no defaults of its
own).

=========  =========================================================================================
main       the group: subcommands loaded on first use, errors and interrupts as exit codes
options    click options made from a settings dataclass's fields (``scan``'s are ScanSettings's)
scan       ``headscope scan``
show       ``headscope show``
plot       ``headscope plot``
report     ``headscope report``
compare    ``headscope compare``
kvplan     ``headscope kvplan``
sweep      ``headscope sweep``
census     ``headscope census``
patch      ``headscope patch``
circuit    ``headscope circuit``
discover   ``headscope discover``
qk         ``headscope qk``
icl        ``headscope icl``
models     ``headscope models``
metrics    ``headscope metrics``
engines    ``headscope engines``
=========  =========================================================================================

A new subcommand: one file here, one line in :data:`headscope.cli.main.COMMANDS`.
"""

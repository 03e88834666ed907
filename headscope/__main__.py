"""``python -m headscope`` is the ``headscope`` command."""

from headscope.cli import main

main()

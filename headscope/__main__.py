"""``python -m headscope`` is the ``headscope`` command."""

from headscope.cli.main import main

main()

"""headscope's version: the one place (the build reads it; ``headscope.__version__`` is this)."""

__version__ = "0.1.0"

"""The ``headscope`` command group: errors and interrupts as exit codes, and the list of
subcommands.

Each subcommand is one file of :mod:`headscope.cli`, named in :data:`COMMANDS` and imported only
when it runs or when ``--help`` lists it (those files import nothing heavy at the top), so
``headscope --help`` and a refused input answer in well under a second. Results go to stdout,
progress to stderr; any bad input exits 2 with one line, before any output exists. Ctrl-C and
SIGTERM stop any command with exit 130 / 143; a scan leaves no partial run directory behind
(:mod:`headscope.rundir`).
"""

from __future__ import annotations

import sys
from importlib import import_module

import click

#: name -> "module:command", in the order ``--help`` lists them. A new subcommand: one file here,
# one line.
COMMANDS = {
    "scan": "headscope.cli.scan:scan",
    "show": "headscope.cli.show:show",
    "plot": "headscope.cli.plot:plot",
    "report": "headscope.cli.report:report",
    "compare": "headscope.cli.compare:compare",
    "kvplan": "headscope.cli.kvplan:kvplan",
    "sweep": "headscope.cli.sweep:sweep",
    "census": "headscope.cli.census:census",
    "patch": "headscope.cli.patch:patch",
    "circuit": "headscope.cli.circuit:circuit",
    "discover": "headscope.cli.discover:discover",
    "qk": "headscope.cli.qk:qk",
    "icl": "headscope.cli.icl:icl",
    "models": "headscope.cli.models:models",
    "metrics": "headscope.cli.metrics:metrics",
    "engines": "headscope.cli.engines:engines",
}


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"headscope: error: {msg}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Subcommands loaded on first use; :class:`HeadscopeError` as one line on stderr and exit code
    2; an interrupt (Ctrl-C, SIGTERM) as one line and 128 + the signal number."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name].split(":")
        return getattr(import_module(module), attr)

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name is not None and name not in COMMANDS and not name.startswith("-"):
            from headscope.errors import did_you_mean

            _fail(
                f"No such command '{name}'.{did_you_mean(name, COMMANDS)} Commands: "
                f"{', '.join(COMMANDS)}."
            )
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        from headscope.errors import HeadscopeError
        from headscope.rundir.signals import interruptible

        try:
            with interruptible():
                return super().invoke(ctx)
        except HeadscopeError as exc:
            _fail(str(exc))
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", 2)
            what = "SIGTERM" if signum == 15 else "Ctrl-C"
            written = getattr(exc, "written", None)
            if written is not None:  # it arrived during the final rename, which was let finish
                _fail(
                    f"interrupted ({what}) as the run was being renamed into place; {written}/ "
                    "is complete.",
                    128 + signum,
                )
            _fail(f"interrupted ({what}); no partial output is left behind.", 128 + signum)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="After ./scripts/bootstrap.sh, run `source .venv/bin/activate` once per shell "
    "(or type .venv/bin/headscope). `headscope COMMAND --help` says more.",
)
@click.version_option(package_name="headscope")
def main() -> None:
    """Find out what each attention head of a pretrained transformer does."""


if __name__ == "__main__":  # pragma: no cover
    main()

"""Click options made from a settings dataclass's fields, and the dataclass made back from them.

A field's metadata (set with :func:`headscope.scanner.config.opt`) gives its help text and how the
command line spells it; its type and default give the option's. So ``headscope scan --help`` can
never disagree with :class:`~headscope.scanner.config.ScanSettings`, and a new setting is one field.

=================  ===========================================================================
field              option
=================  ===========================================================================
``bool`` False     ``--name`` (a flag)
``bool`` True      ``--name/--no-name``
``int``, ``float``  ``--name N`` (``None`` default: optional, its default said in the help)
``kind="csv"``     ``--name a,b,c`` -> a tuple
``thresholds``     ``--threshold METRIC=VALUE`` (repeatable) -> a dict
``memory``         ``--max-memory 0=20GiB,cpu=60GiB`` -> a dict of bytes
``floats``         ``--budgets 0.25,0.5`` -> a tuple of floats
``flag_value``     ``--effects`` alone means ``auto``; ``--effects exact`` names the mode
=================  ===========================================================================
"""

from __future__ import annotations

import dataclasses
import types
import typing

import click


def _base_type(tp):
    """``int | None`` -> int; ``str`` -> str (annotations are strings under ``from __future__``)."""
    if isinstance(tp, str):
        # noqa: S307 - our own annotations
        tp = eval(tp, {"Mapping": typing.Mapping, "Sequence": typing.Sequence}, {})
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if args else str
    return tp if tp in (int, float, str, bool) else str


def option_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def _choices_text(choices) -> str:
    if choices == "engines":
        from headscope.engines.registry import AUTO, engine_names

        choices = [AUTO, *engine_names()]
    return f" One of: {', '.join(choices)}." if choices else ""


def declared_by(cls, name: str) -> int:
    """How far up ``cls``'s bases the setting ``name`` was first declared (0: by ``cls``)."""
    return next(
        i for i, k in enumerate(cls.__mro__) if name in k.__dict__.get("__annotations__", {})
    )


def config_options(cls, skip: tuple[str, ...] = ()):
    """A decorator adding one click option per field of ``cls`` (in field order), except
    ``skip``."""

    # the command's own settings first, then those of the groups it shares (headscope.settings)
    ordered = sorted(dataclasses.fields(cls), key=lambda f: declared_by(cls, f.name))

    def decorate(command):
        for f in reversed(ordered):
            if f.name in skip or "help" not in f.metadata:
                continue
            meta = f.metadata
            default = f.default if f.default is not dataclasses.MISSING else None
            tp = _base_type(f.type)
            help_text = meta["help"] + (
                "" if "One of" in meta["help"] else _choices_text(meta.get("choices"))
            )
            kind = meta.get("kind")
            name = option_name(f)
            if tp is bool:
                decl = [name] if not default else [f"{name}/--no-{name[2:]}"]
                command = click.option(
                    *decl,
                    f.name,
                    is_flag=True,
                    default=bool(default),
                    show_default=bool(default),
                    help=help_text,
                )(command)
            elif kind == "thresholds":
                command = click.option(
                    name, f.name, multiple=True, metavar=meta.get("metavar"), help=help_text
                )(command)
            elif "flag_value" in meta:
                command = click.option(
                    name,
                    f.name,
                    is_flag=False,
                    flag_value=meta["flag_value"],
                    default=default,
                    metavar=meta.get("metavar"),
                    help=help_text,
                )(command)
            elif kind == "floats":
                command = click.option(
                    name,
                    f.name,
                    type=str,
                    default=",".join(f"{v:g}" for v in default),
                    show_default=True,
                    help=help_text,
                )(command)
            else:
                ctype = (
                    click.Path(dir_okay=False)
                    if kind == "path"
                    else (str if kind in ("csv", "memory") else tp)
                )
                if kind == "csv" and isinstance(default, (tuple, list)):
                    default = ",".join(map(str, default))  # the option's text: a,b,c
                show = default is not None and kind != "memory"
                command = click.option(
                    name,
                    f.name,
                    type=ctype,
                    default=default,
                    show_default=show,
                    metavar=meta.get("metavar"),
                    help=help_text,
                )(command)
        return command

    return decorate


def _floats(text: str, what: str) -> tuple[float, ...]:
    from headscope.errors import HeadscopeError

    try:
        values = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise HeadscopeError(
            f"{what} must be numbers separated by commas, e.g. 0.25,0.5,0.75; got '{text}'."
        ) from None
    if not values:
        raise HeadscopeError(
            f"{what} is empty; give numbers separated by commas, e.g. 0.25,0.5,0.75."
        )
    return values


def config_from(cls, values: dict):
    """``cls`` from the values click parsed for its fields (the others are left out)."""
    from headscope.models.placement import parse_max_memory
    from headscope.scanner.config import parse_thresholds

    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        v = values[f.name]
        kind = f.metadata.get("kind")
        if kind == "csv" and v is not None:
            v = tuple(v.split(","))
        elif kind == "floats":
            v = _floats(v, option_name(f))
        elif kind == "thresholds":
            v = parse_thresholds(v or ())
        elif kind == "memory":
            v = parse_max_memory(v)
        out[f.name] = v
    return cls(**out)


def _figure_formats(_ctx, _param, value):
    from headscope.files import figure_formats

    return figure_formats(value) if value else None


def figure_format_option(command):
    """``--figure-format png,svg,pdf`` (repeatable, or comma-separated): the files each figure is
    written as. The command gets ``figure_format``: a tuple of formats, or None when not given."""
    return click.option(
        "--figure-format",
        "figure_format",
        multiple=True,
        metavar="FORMAT[,FORMAT]",
        callback=_figure_formats,
        help="Write each figure as png, svg and/or pdf (repeatable, or comma-separated: "
        "png,svg,pdf). SVG and PDF keep their text as text, for papers. [default: png]",
    )(command)


# ------------------------------------------------------------------------------ a run's command


def out_option(help: str = "Run directory to write.", required: bool = False):
    """``--out PATH``: where the command's run directory goes."""
    return click.option("--out", "out", required=required, default=None, type=click.Path(),
                        help=help)  # fmt: skip


def run_options(what: str, figures: str | None = "the heatmaps"):
    """What every command that writes a run directory takes: ``--force`` (replaces only a
    ``what``), ``--no-figures`` (skips ``figures``; None: no such option), ``--figure-format``
    and ``--quiet``."""

    def decorate(command):
        command = click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")(
            command
        )
        command = figure_format_option(command)
        if figures is not None:
            command = click.option("--no-figures", is_flag=True, help=f"Skip {figures}.")(command)
        return click.option(
            "--force", is_flag=True, help=f"Replace an existing {what} (never any other folder)."
        )(command)

    return decorate


def task_options(scan_help: str):
    """``--task KIT|FILE`` (the kits as the registry names them) and ``--scan RUN_DIR``."""

    def decorate(command):
        from headscope.probes.kits import KITS

        command = click.option(
            "--scan", "scan", type=click.Path(), default=None, metavar="RUN_DIR", help=scan_help
        )(command)
        return click.option(
            "--task",
            "task",
            required=True,
            metavar="KIT|FILE",
            help=f"A built-in kit ({', '.join(KITS)}) or a .jsonl / .tsv file of prompt pairs.",
        )(command)

    return decorate


def say_to_stderr(quiet: bool):
    """Progress lines to stderr as ``headscope: ...``, unless ``quiet``."""

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"headscope: {msg}", err=True)

    return say


def task_run_options(settings, what: str, figures: str, scan_help: str):
    """Every option of a command on a task's prompt pairs (``patch``, ``circuit``): ``--task``,
    ``--scan``, ``--out``, one per field of ``settings``, then :func:`run_options`."""

    def decorate(command):
        command = run_options(what, figures)(command)
        command = config_options(settings)(command)
        command = out_option(required=True)(command)
        return task_options(scan_help)(command)

    return decorate


def run_task(to_dir, settings_type, model_name, *, task, out, scan, force, no_figures,
             figure_format, quiet, **settings) -> None:  # fmt: skip
    """What ``patch`` and ``circuit`` do with what was typed: the settings checked (before
    anything heavy loads), ``to_dir`` run, the run's summary printed."""
    from headscope.report.tables import task_summary

    config = config_from(settings_type, settings)
    result = to_dir(
        model_name, task, out, config, scan=scan, force=force, figures=not no_figures,
        say=say_to_stderr(quiet), figure_formats=figure_format,
    )  # fmt: skip
    click.echo(task_summary(result, out))

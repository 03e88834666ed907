"""``headscope sweep``: wiring only (the work and every check are in headscope.apps.sweep).

A standalone click command registered on the main group with ``main.add_command(sweep)``; the group
turns :class:`~headscope.errors.HeadscopeError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import click

from headscope.cli.options import figure_format_option, say_to_stderr


@click.command()
@click.argument("spec", type=click.Path())
@click.option(
    "--out",
    type=click.Path(),
    required=True,
    help="The sweep's folder (rerun with the same --out to resume).",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="local",
    default=None,
    metavar="[ADDRESS]",
    help="Run the jobs as Ray tasks: a local instance, or the cluster at ADDRESS "
    "(HOST:PORT from "
    "`ray start --head`, auto, ray://HOST:10001). [default: one after another, here]",
)
@click.option(
    "--workers", type=int, default=None, help="Jobs at once on Ray. [default: the cluster's CPUs]"
)
@click.option("--retries", type=int, default=1, show_default=True, help="Retries of a failed job.")
@figure_format_option
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def sweep(spec, out, ray_address, workers, retries, figure_format, quiet) -> None:
    """Scan models or training checkpoints x probe settings x seeds, one run directory per job, and
    gather them into one atlas (atlas.csv/.parquet, steps.png, models.png).

    \b
    headscope sweep examples/sweep.toml --out sweeps/offline       # runs as written, offline
    headscope sweep SPEC.toml --out sweeps/phase --ray --workers 2

    \b
    SPEC (TOML; paths relative to its folder):
      seeds = [0, 1]                       # default [0]
      models = ["smollm2-135m"]            # names, folders, NAME@REVISION
      [[checkpoints]]                      # one training run's checkpoints
      model = "my-run"                     # its name in the atlas
      glob = "ckpts/step-*"                # or folders = [...], or revisions = [...]
      [scan]                               # scan settings of every job
      metrics = ["induction"]              # (any `headscope scan` option, with _)
      [[settings]]                         # probe settings swept
      repeat_len = 20
    """
    from headscope.apps.sweep import run_sweep

    say = say_to_stderr(quiet)
    done = run_sweep(
        spec, out, ray_address, workers, retries, say, figure_formats=figure_format or ("png",)
    )
    atlas, failures = done["atlas"], done["failures"]
    jobs = atlas["job"].nunique()
    click.echo(
        f"{jobs} job(s): {jobs - len(failures)} done ({done['skipped']} already), "
        f"{len(failures)} failed"
    )
    for path in done["files"]:
        click.echo(str(path))
    if failures:
        for job, why in failures.items():
            click.echo(
                f"headscope: job {job} failed after {why['attempts']} attempt(s): {why['error']}",
                err=True,
            )
        sys.exit(1)

"""Options `run` and `top` share for watching a run: the sample interval and the straggler
rule's window, hold and ratio (docs/top.md). Declared once, spelled the same in both."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli.groups import WATCH

SampleIntervalOpt = Annotated[float, typer.Option(
    "--sample-interval", min=0, metavar="SECONDS", rich_help_panel=WATCH,
    help="Archive every node's GPU/CPU/network readings and each "
         "rank's CPU time every S s in samples.jsonl (0: off; "
         "also turns straggler detection off).")]
StragglerWindowOpt = Annotated[float, typer.Option(
    "--straggler-window", min=1, metavar="SECONDS", rich_help_panel=WATCH,
    help="Seconds of per-rank CPU time compared to find the rank "
         "that is rarely waiting (docs/top.md).")]
StragglerHoldOpt = Annotated[float, typer.Option(
    "--straggler-hold", min=0, metavar="SECONDS", rich_help_panel=WATCH,
    help="Seconds the evidence must hold before a node is flagged.")]
StragglerRatioOpt = Annotated[float, typer.Option(
    "--straggler-ratio", min=1.01, metavar="RATIO", rich_help_panel=WATCH,
    help="A straggler is at least this many times as busy as "
         "the median of the other nodes' ranks.")]

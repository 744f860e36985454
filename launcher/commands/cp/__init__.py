"""`dtrain cp`: copy files to every node (pdcp) or from every node (rpdcp), in parallel.

One module per engine (docs/architecture.md):

- ``request``: the request, the sources listed before anything connects, their sums and
  bytes on the launcher's side;
- ``stream``: the push as one stream through dtrain's node program (``cpnode`` unpack);
- ``sftp``: the SFTP engine (pull, and the push's fallback);
- ``relay``: the broadcast of large files down a chain of node relays;
- ``shared``: what a node's part of one copy shares, and the one hand-off to the broadcast;
- ``command``: every node through its engine, the exit code; ``view``: what cp prints.

The decisions (what to send, skip, delete; which files go down which chain) are pure and
live in ``launcher.decide.copies.copyplan`` and ``launcher.decide.copies.broadcast``.
"""

from __future__ import annotations

from launcher.commands.cp.command import cp_async, push_node, run_cp
from launcher.commands.cp.relay import Broadcaster
from launcher.commands.cp.request import CopyRequest, Source, prepare_pull, prepare_push
from launcher.commands.cp.shared import Copy, Target

__all__ = ["Broadcaster", "Copy", "CopyRequest", "Source", "Target", "cp_async",
           "prepare_pull", "prepare_push", "push_node", "run_cp"]

"""`stackproof gc`: what runs that died unclean left on this host."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pipeline.errors import InfraError
from stackproof.cli.common import Command
from stackproof.cli.common import emit as _emit

if TYPE_CHECKING:
    from pipeline.docker.client import Docker


__all__ = ["COMMANDS"]


def _gc(args: argparse.Namespace) -> int:
    """Containers and host server processes of dead runs; with no daemon, the host's only."""
    from pipeline.docker.client import Docker
    from verify.runtime.host import remove_dead_host_runs

    ended = remove_dead_host_runs()
    for run in ended:
        print(f"stackproof: ended {run}: its run is gone", file=sys.stderr)
    try:
        docker: Docker | None = Docker.connect()
    except InfraError as exc:
        print(f"stackproof: no docker daemon ({exc}): host processes only", file=sys.stderr)
        docker = None
    from stackproof.runjob import remove_dead_runs

    removed = remove_dead_runs(docker) if docker else []
    summary = f"{len(removed)} container(s) and {len(ended)} host server(s) of dead runs removed"
    _emit(args, {"removed": removed, "host_runs_ended": ended}, summary)
    return 0


COMMANDS = (Command(path=("gc",), help="remove containers of dead runs on this host (owner gone)", handler=_gc),)

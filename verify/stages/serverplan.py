"""Which servers one verification starts: as few as the stages allow, never two at once.

A GPU server start costs minutes (model load, torch.compile, FlashInfer JIT, autotuning), and
two servers on one GPU fight for its memory. The autotune stage needs a server that started with
a fresh, empty autotune cache and with the kernel-selection variables the arm does not set
removed. When the image and the serve spec set none of those variables (the usual case), the
startup server *is* that server once it gets the fresh cache: it is started with it, autotune
judges what it wrote, and load runs on it. Only when the image sets one of them does autotune
need a server of its own (and load then a fresh one, since the two may not share a GPU).

`plan_servers` is pure: the cell, the arm, the stages and the image's ENV in, a plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.matrix.model import Arm, Cell
from verify.serving import AutotuneFacts, driver_for

__all__ = ["CACHE_MOUNT", "ServerPlan", "plan_servers", "tuning_facts"]

# Where the tuning server's cache lives: an anonymous volume, named to the engine by the driver's
# cache variable (`AutotuneFacts.cache_env`).
CACHE_MOUNT = "/stackproof/autotune-cache"


def tuning_facts(cell: Cell, version: str | None = None) -> AutotuneFacts | None:
    """The cell's engine's autotune facts at `version` (None: its newest); None when it has no
    FlashInfer autotune cache. The variables it controls are the same in every release known."""
    return driver_for(cell.serve).autotune_at(version)


@dataclass(frozen=True, kw_only=True)
class ServerPlan:
    startup_tunes: bool  # the startup server starts with the fresh autotune cache; autotune judges it
    keep_startup: bool  # the startup server stays up for a later stage (autotune, load)
    autotune_own: bool  # autotune starts a server of its own
    load_fresh: bool  # load starts a server of its own
    starts: int  # servers this plan starts when every stage passes
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "startup_tunes": self.startup_tunes,
            "autotune_own_server": self.autotune_own,
            "load_own_server": self.load_fresh,
            "planned_starts": self.starts,
            "reason": self.reason,
        }


def plan_servers(cell: Cell, arm: Arm | None, stages: tuple[str, ...], image_env: Mapping[str, str]) -> ServerPlan:
    startup, load = "startup" in stages, "load" in stages
    if cell.serve is None:
        return ServerPlan(
            startup_tunes=False,
            keep_startup=False,
            autotune_own=False,
            load_fresh=False,
            starts=0,
            reason="the cell has no serve spec",
        )
    tuning = tuning_facts(cell)
    tunes = cell.is_gpu and "autotune" in stages and tuning is not None
    blockers = _tuning_blockers(cell, arm, image_env, tuning) if tuning else []
    startup_tunes = startup and tunes and not blockers
    autotune_own = tunes and not startup_tunes
    load_fresh = load and (not startup or autotune_own)
    keep_startup = startup and (startup_tunes or (load and not load_fresh))
    starts = int(startup) + int(autotune_own) + int(load_fresh)
    if startup_tunes:
        reason = "the startup server carries the fresh autotune cache" + (" and serves the load" if load else "")
    elif tunes and blockers:
        reason = (
            f"autotune needs its own server: {', '.join(blockers)} set by the image or serve env "
            "would change what the startup server tunes"
        )
    elif tunes:
        reason = "autotune runs without the startup stage, on its own server"
    elif startup and load:
        reason = "the startup server serves the load"
    else:
        reason = "each selected stage starts its own server"
    return ServerPlan(
        startup_tunes=startup_tunes,
        keep_startup=keep_startup,
        autotune_own=autotune_own,
        load_fresh=load_fresh,
        starts=starts,
        reason=reason,
    )


def _tuning_blockers(cell: Cell, arm: Arm | None, image_env: Mapping[str, str], tuning: AutotuneFacts) -> list[str]:
    """Variables that make the startup server differ from a fresh-cache autotune server."""
    arm_env = dict(arm.env) if arm else {}
    set_outside_arm = {**dict(cell.env), **image_env, **dict(cell.serve.env if cell.serve else ())}
    controlled = [name for name in tuning.controlled_env if name in set_outside_arm and name not in arm_env]
    # A cache location chosen by the image (or arm) would be replaced by the fresh one.
    chosen = [tuning.cache_env] if tuning.cache_env in {**set_outside_arm, **arm_env} else []
    return sorted(controlled + chosen)

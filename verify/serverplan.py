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

from pipeline.model import Arm, Cell

__all__ = ["CACHE_MOUNT", "CONTROLLED_ENV", "TUNING_ENV", "ServerPlan", "plan_servers"]

# vLLM reads the autotune cache location from this variable (vllm/envs.py L1714-1716; the file is
# <dir>/<hash>/autotune_configs.json, model_executor/warmup/flashinfer_autotune_cache.py L24-41).
TUNING_ENV = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
CACHE_MOUNT = "/stackproof/autotune-cache"
# What the autotune stage removes unless the arm sets it: kernel choice (envs.py L1201-1205) and
# skipped tuning ops (envs.py L1720-1728) change what gets tuned.
CONTROLLED_ENV = ("VLLM_DISABLED_KERNELS", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS")


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
    tunes = cell.is_gpu and "autotune" in stages
    blockers = _tuning_blockers(cell, arm, image_env)
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


def _tuning_blockers(cell: Cell, arm: Arm | None, image_env: Mapping[str, str]) -> list[str]:
    """Variables that make the startup server differ from a fresh-cache autotune server."""
    arm_env = dict(arm.env) if arm else {}
    set_outside_arm = {**dict(cell.env), **image_env, **dict(cell.serve.env if cell.serve else ())}
    controlled = [name for name in CONTROLLED_ENV if name in set_outside_arm and name not in arm_env]
    # A cache location chosen by the image (or arm) would be replaced by the fresh one.
    chosen = [TUNING_ENV] if TUNING_ENV in {**set_outside_arm, **arm_env} else []
    return sorted(controlled + chosen)

"""Layered host environments: a few pinned packages over a built environment, sharing the rest.

`stackproof bisect` needs one environment per probed version of one package. A full host build
of cpu-tiny-host copies 2.1 GB (vLLM, torch) in about 45 s; five of them would fill the disk of a
small runner for a package of a few kilobytes. A layer is instead a small virtual environment of
the same interpreter whose site-packages holds only the pinned packages and one `.pth` line that
adds the base environment's site-packages after its own (`site.addsitedir`, so the base's own
`.pth` files run as they would there). Python finds the layer's copy of a pinned package first,
and importlib.metadata reports the layer's version first (it walks sys.path in order); the base
is never written to. The base's console scripts are rewritten with the layer's interpreter (the
host runtime finds `vllm` on the environment's PATH), and its `files/` (the recipes' model) is
shared by a symbolic link.

A layer is named by its content like a full environment (`envs/<cell>-L<digest15>`): the base's
plan digest and the pins' requirement text; a second request of the same layer finds it built.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.plan import RequirementGroup, override_groups
from pipeline.cache import cache_dir, locked
from pipeline.host.env import (  # the same install steps as a full build
    ENVS_DIR,
    HostEnv,
    HostEnvPlan,
    _install_step,
    _step,
    _uv,
    built_env_at,
    built_host_env,
)
from pipeline.matrix.model import Cell, Matrix, Requirement
from pipeline.matrix.site import SiteSettings

__all__ = ["LAYER_PTH", "LayerPlan", "build_layer", "built_layer", "given_base_plan", "plan_layer"]

COMPLETE = "stackproof-env.json"
# Sorted before the pinned packages' own .pth files (site reads them in name order): the base's
# directory joins sys.path first, so their hooks may import from it.
LAYER_PTH = "_stackproof_layer.pth"


@dataclass(frozen=True, kw_only=True)
class LayerPlan:
    """Pins over a base environment (pure): what the layer installs, and its name from that."""

    base: HostEnvPlan
    pins: tuple[Requirement, ...]
    groups: tuple[RequirementGroup, ...]
    digest: str
    given: Path | None = None  # the base is an existing environment (`--python`): its interpreter

    @property
    def name(self) -> str:
        return f"{self.base.cell.id}-L{self.digest.removeprefix('sha256:')[:15]}"


def plan_layer(base: HostEnvPlan, pins: tuple[Requirement, ...], *, given: Path | None = None) -> LayerPlan:
    groups = override_groups(pins, None)  # no lock holds a bisected version: installed by pin, --no-deps
    inputs = {"base": base.digest, "pins": [g.text for g in groups], "indexes": [g.index for g in groups]}
    digest = "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return LayerPlan(base=base, pins=pins, groups=groups, digest=digest, given=given)


def given_base_plan(cell: Cell, env: HostEnv) -> HostEnvPlan:
    """The plan standing for an existing environment (`bisect --python`, a GPU host's own venv, which
    no `install:` describes): its content is its inventory, so its digest names the layers over it."""
    return HostEnvPlan(
        cell=cell, python_version=env.python_version, lock_groups=(), override_groups=(), recipes=(), digest=env.digest
    )


def built_layer(plan: LayerPlan, *, envs_dir: Path | None = None) -> HostEnv | None:
    """The layer of this content, when a complete build of it is here (and its base still is)."""
    root = (envs_dir or cache_dir() / ENVS_DIR) / plan.name
    if not (root / COMPLETE).is_file():
        return None
    base_here = plan.given.exists() if plan.given is not None else built_host_env(plan.base, envs_dir=envs_dir)
    return built_env_at(root) if base_here else None


def build_layer(
    plan: LayerPlan, base: HostEnv, site: SiteSettings, matrix: Matrix, *, envs_dir: Path | None = None
) -> HostEnv:
    """Make the layer of `plan` over `base` (built, or given with `plan.given`), or reuse it; progress on stderr."""
    assert base.root is not None or plan.given is not None, "a layer sits on a built or a given environment"
    envs = envs_dir or cache_dir() / ENVS_DIR
    with locked(envs):
        existing = built_layer(plan, envs_dir=envs)
        if existing is not None:
            print(f"{plan.base.cell.id}: layer {existing.root} is built (same content)", file=sys.stderr)
            return existing
        root = envs / plan.name
        shutil.rmtree(root, ignore_errors=True)  # an unfinished build of the same content
        started = time.monotonic()
        try:
            _make_layer(plan, base, site, matrix, root=root, log=envs / f"{plan.name}.log")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)  # nothing half-built is ever found as built
            raise
        seconds = round(time.monotonic() - started, 1)
        base_name = str(base.root or base.python)
        marker = {"cell": plan.base.cell.id, "digest": plan.digest, "base": base_name, "built_in_s": seconds}
        (root / COMPLETE).write_text(json.dumps(marker) + "\n")
    env = built_layer(plan, envs_dir=envs)
    assert env is not None
    print(f"{plan.base.cell.id}: layer built in {seconds:.1f}s: {root}", file=sys.stderr)
    return HostEnv(**{**env.__dict__, "source": "built", "built_in_s": seconds})


def _make_layer(plan: LayerPlan, base: HostEnv, site: SiteSettings, matrix: Matrix, *, root: Path, log: Path) -> None:
    uv = _uv()
    venv = root / "venv"
    python = venv / "bin" / "python"
    root.mkdir(parents=True)
    if base.root is not None:
        (root / "files").symlink_to(base.root / "files")
        base_venv = base.root / "venv"
    else:  # a given environment: its interpreter is VENV/bin/python, and it has no files of a recipe
        (root / "files").mkdir()
        base_venv = base.python.parent.parent
    requirements = root / "requirements"
    requirements.mkdir()
    interpreter = os.path.realpath(base.python)  # the very interpreter of the base: its wheels' ABI
    with log.open("w") as out:
        _step(
            "venv", [uv, "venv", "--no-python-downloads", "--python", interpreter, str(venv)], {}, out, log, secrets=()
        )
        base_site = _site_packages(base_venv)
        _site_packages(venv).joinpath(LAYER_PTH).write_text(f"import site; site.addsitedir({str(base_site)!r})\n")
        _rewrite_scripts(base_venv / "bin", venv / "bin", base.python, python)
        for group in plan.groups:
            title, argv, env = _install_step(
                uv, python, group, requirements, site.index_location(matrix, group.index), site
            )
            out.write(f"# {title}\n")
            out.flush()
            _step(title, argv, env, out, log, secrets=site.secrets())


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    assert len(found) == 1, f"{venv}: expected one site-packages, found {found}"
    return found[0]


def _rewrite_scripts(base_bin: Path, layer_bin: Path, base_python: Path, layer_python: Path) -> None:
    """The base's console scripts, pointed at the layer's interpreter (uv writes `#!<venv>/bin/python`)."""
    shebang = f"#!{base_python}".encode()
    for script in sorted(base_bin.iterdir()):
        target = layer_bin / script.name
        if target.exists() or target.is_symlink() or not script.is_file() or script.is_symlink():
            continue
        text = script.read_bytes()
        if text.split(b"\n", 1)[0] != shebang:
            continue
        target.write_bytes(f"#!{layer_python}".encode() + text[len(shebang) :])
        target.chmod(0o755)

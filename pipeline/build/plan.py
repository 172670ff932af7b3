"""Plan a cell's build: its Dockerfile, its context files, and its content-addressed tag.

`render_plan` decides nothing from the outside world: given the cell, the resolved base reference,
the lock and the local wheels a mirror provides, it renders the templates and recipe files of
this checkout into a `BuildPlan`. `plan_cell` is the thin edge that gathers
those inputs (reads the lock, hashes local wheels, resolves a base that is another cell).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

import pipeline
from pipeline.build.lock import Lock, read_lock
from pipeline.build.render import image_file, render_template, template_text
from pipeline.cache import file_sha256
from pipeline.errors import InputError
from pipeline.matrix.model import ArchiveBase, BootstrapBase, Cell, CellBase, HostBase, Matrix, Requirement
from pipeline.matrix.site import SiteSettings

__all__ = [
    "BuildPlan",
    "LocalWheel",
    "RequirementGroup",
    "lock_groups",
    "override_groups",
    "plan_cell",
    "render_plan",
    "write_plan",
]

TAG_REPOSITORY = "stackproof"


@dataclass(frozen=True, kw_only=True)
class LocalWheel:
    """A distribution file a local-directory mirror provides; staged into the build context."""

    index: str
    path: Path
    sha256: str

    @property
    def context_path(self) -> str:
        return f"stackproof/wheels/{self.index}/{self.path.name}"


@dataclass(frozen=True, kw_only=True)
class RequirementGroup:
    index: str
    file: str
    text: str
    pins: tuple[str, ...]
    hashed: bool

    @property
    def count(self) -> int:
        return len(self.pins)


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    cell: Cell
    base_ref: str
    dockerfile: str
    files: tuple[tuple[str, bytes], ...]  # context-relative path -> content
    local_wheels: tuple[LocalWheel, ...]
    indexes: tuple[str, ...]  # indexes the build needs an `index-NAME` secret for

    @property
    def digest(self) -> str:
        """sha256 over the Dockerfile, every context file and the base reference."""
        h = hashlib.sha256()
        h.update(f"base {self.base_ref}\n".encode())
        h.update(b"Dockerfile\n" + hashlib.sha256(self.dockerfile.encode()).hexdigest().encode() + b"\n")
        entries = [(path, hashlib.sha256(data).hexdigest()) for path, data in self.files]
        entries += [(w.context_path, w.sha256) for w in self.local_wheels]
        for path, digest in sorted(entries):
            h.update(f"{path} {digest}\n".encode())
        return h.hexdigest()

    @property
    def tag(self) -> str:
        return f"{TAG_REPOSITORY}/{self.cell.id}:{self.digest[:16]}"


def plan_cell(matrix: Matrix, cell: Cell, site: SiteSettings, images_dir: Path) -> BuildPlan:
    """Gather the cell's inputs (lock, local wheels, base) and render its plan."""
    base = cell.base
    if isinstance(base, HostBase):
        raise InputError(
            f"{matrix.file}:{cell.line}: cells[{cell.id}] runs on the host runtime: it has no image to render or build "
            "(`stackproof build` makes its Python environment)"
        )
    if isinstance(base, CellBase):
        parent = plan_cell(matrix, matrix.cell(base.cell), site, images_dir)  # its tag is our base
        base_ref, python = parent.tag, matrix.python_of(cell)
    elif isinstance(base, BootstrapBase):
        from pipeline.build.bootstrap import base_tag

        base_ref, python = base_tag(base), base.python
    elif isinstance(base, ArchiveBase):
        base_ref, python = base.tag, base.python  # the tag is the archive's sha256: the content tag pins it
    else:
        base_ref, python = base.reference, base.python
    lock = read_lock(cell) if cell.install else None
    wanted = _wanted_from_local_mirrors(cell, lock, site)
    return render_plan(
        cell,
        base_ref=base_ref,
        python=python,
        lock=lock,
        local_wheels=_find_local_wheels(wanted, site),
        venv=base.recipe.venv if isinstance(base, BootstrapBase) else None,
        images_dir=images_dir,
        # `docker import` of a tree packed without /tmp (gpu-docker.md section 5): pip needs one.
        make_tmp=isinstance(base, ArchiveBase) and base.format == "rootfs",
    )


def write_plan(plan: BuildPlan, target: Path) -> None:
    """`stackproof render`: the plan's build context as files (its Dockerfile, its requirement
    files and recipes) under `target`, for a person to read or a plain `docker build` to use."""
    target.mkdir(parents=True, exist_ok=True)
    (target / "Dockerfile").write_text(plan.dockerfile)
    for rel, data in plan.files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)


def render_plan(
    cell: Cell,
    *,
    base_ref: str,
    python: str,
    lock: Lock | None,
    local_wheels: tuple[LocalWheel, ...],
    venv: str | None,
    images_dir: Path,
    make_tmp: bool = False,
) -> BuildPlan:
    """The Dockerfile and context files for `cell`, from this checkout's templates and recipes."""
    # Overridden packages stay in the lock install and the override reinstalls them on top: the
    # locked layer (gigabytes) then never changes when an override is added or moved, and recipes
    # that run between the two (the tiny model needs tqdm) see a complete stack.
    locked = lock_groups(lock, skip=set(cell.uninstall)) if lock else ()
    overrides = override_groups(cell.overrides, lock)
    files: dict[str, bytes] = {"stackproof/pip-install.sh": template_text(images_dir, "pip-install.sh").encode()}
    for group in (*locked, *overrides):
        files[f"stackproof/requirements/{group.file}"] = group.text.encode()
    snippets = []
    for recipe in cell.recipes:
        recipe_dir = images_dir / "recipes" / recipe
        for path in _recipe_files(recipe_dir):
            files[f"stackproof/recipes/{recipe}/{path.relative_to(recipe_dir)}"] = image_file(path)
        snippets.append(render_template(images_dir, f"recipes/{recipe}/steps.j2", python=python, cell=cell).strip())
    labels = _labels(cell, base_ref)
    dockerfile = render_template(
        images_dir,
        "cell.Dockerfile.j2",
        cell=cell,
        base_ref=base_ref,
        python=python,
        venv=venv,
        make_tmp=make_tmp,
        lock_groups=locked,
        override_groups=overrides,
        recipe_snippets=snippets,
        labels=labels,
        tool_version=pipeline.__version__,
    )
    indexes = tuple(sorted({g.index for g in (*locked, *overrides)}))
    return BuildPlan(
        cell=cell,
        base_ref=base_ref,
        dockerfile=dockerfile,
        files=tuple(sorted(files.items())),
        local_wheels=tuple(w for w in local_wheels if w.index in indexes),
        indexes=indexes,
    )


def _recipe_files(recipe_dir: Path) -> list[Path]:
    """The recipe's own files: not its template, not tool caches or hidden files, which would
    otherwise make the tag differ between a working tree and a fresh clone."""
    return sorted(
        path
        for path in recipe_dir.rglob("*")
        if path.is_file()
        and path.name not in ("steps.j2", "host.j2")
        and not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(recipe_dir).parts)
    )


def lock_groups(lock: Lock, skip: set[str]) -> tuple[RequirementGroup, ...]:
    groups = []
    for index in sorted({p.index for p in lock.packages}):
        packages = [p for p in lock.packages if p.index == index and p.name not in skip]
        if packages:
            text = "".join(
                f"{p.name}=={p.version} " + " ".join(f"--hash={h}" for h in p.hashes) + "\n" for p in packages
            )
            pins = tuple(f"{p.name}=={p.version}" for p in packages)
            groups.append(RequirementGroup(index=index, file=f"lock-{index}.txt", text=text, pins=pins, hashed=True))
    return tuple(groups)


def override_groups(overrides: tuple[Requirement, ...], lock: Lock | None) -> tuple[RequirementGroup, ...]:
    """One group per index. Hash-locked when the lock holds exactly that version."""
    groups = []
    for index in sorted({o.index for o in overrides}):
        members = [o for o in overrides if o.index == index]
        locked = [lock.get(o.name) if lock else None for o in members]
        hashed = all(
            p is not None and Version(p.version) == Version(o.version) and p.hashes
            for p, o in zip(locked, members, strict=True)
        )
        lines = []
        for o, p in zip(members, locked, strict=True):
            hashes = " ".join(f"--hash={h}" for h in p.hashes) if hashed and p else ""
            lines.append(f"{o.pin} {hashes}".rstrip() + "\n")
        groups.append(
            RequirementGroup(
                index=index,
                file=f"overrides-{index}.txt",
                text="".join(lines),
                pins=tuple(o.pin for o in members),
                hashed=hashed,
            )
        )
    return tuple(groups)


def _labels(cell: Cell, base_ref: str) -> list[tuple[str, str]]:
    overrides = [{"name": o.name, "version": o.version, "index": o.index} for o in cell.overrides]
    labels = [
        ("org.opencontainers.image.title", cell.id),
        ("org.opencontainers.image.description", f"stackproof cell {cell.id}"),
        ("org.opencontainers.image.base.name", base_ref),
        ("org.opencontainers.image.vendor", "stackproof"),
        ("io.stackproof.cell", cell.id),
        ("io.stackproof.arch", cell.arch),
        ("io.stackproof.platform", cell.platform),
        ("io.stackproof.overrides", json.dumps(overrides, separators=(",", ":"))),
        ("io.stackproof.tool-version", pipeline.__version__),
    ]
    return labels


def _wanted_from_local_mirrors(cell: Cell, lock: Lock | None, site: SiteSettings) -> dict[str, set[tuple[str, str]]]:
    """For each index served by a local directory here: the (name, version) pairs the build needs."""
    wanted: dict[str, set[tuple[str, str]]] = {}
    pins = [(p.index, p.name, p.version) for p in (lock.packages if lock else ()) if p.name not in cell.uninstall]
    pins += [(o.index, o.name, o.version) for o in cell.overrides]
    for index, name, version in pins:
        mirror = site.mirror(index)
        if mirror is not None and mirror.is_local:
            wanted.setdefault(index, set()).add((name, version))
    return wanted


def _find_local_wheels(wanted: dict[str, set[tuple[str, str]]], site: SiteSettings) -> tuple[LocalWheel, ...]:
    """Pick the files in each local mirror that match a wanted (name, version); hash them."""
    found = []
    for index, pairs in sorted(wanted.items()):
        mirror = site.mirror(index)
        assert mirror is not None
        seen = set()
        for path in sorted(mirror.directory.iterdir()):
            key = _dist_key(path.name)
            if key in pairs:
                seen.add(key)
                found.append(LocalWheel(index=index, path=path, sha256=file_sha256(path)))
        missing = sorted(pairs - seen)
        if missing:
            listing = ", ".join(f"{n}=={v}" for n, v in missing)
            raise InputError(f"mirror {index}={mirror.location}: no file for {listing}")
    return tuple(found)


def _dist_key(filename: str) -> tuple[str, str] | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except ValueError:
        return None
    return str(canonicalize_name(name)), str(version)

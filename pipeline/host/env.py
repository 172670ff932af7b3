"""Host environments: a cell's stack as a Python environment on this host, for the host runtime.

`stackproof build` of a `runtime: host` cell makes what the image build makes, without an image:
a virtual environment created by uv from the cell's hash-checked lock (one install per index, from
exactly that index, `--no-deps --require-hashes`), the cell's `uninstall`, its recipes' host forms
(images/recipes/NAME/host.j2) and its overrides on top. It lives under the cache directory, named by
its content like an image tag (`envs/<cell>-<digest>`), and is reused while the content is the same.
The recipes write under the environment's `files/`, which stands in for the image's `/`.

An environment that already exists (`verify --runtime host --python PY`: a GPU host's own, a
reporter's venv) is used as it is. Either way its identity in a receipt is `inventory_digest`: a
sha256 over every installed distribution (name, version, sha256 of its RECORD) and the interpreter
(version, implementation, sha256 of its binary), read by the environment's own python.

Index locations may carry credentials: uv is given them in its environment (UV_INDEX_URL,
UV_FIND_LINKS), never in argv or a log line; UV_NO_CONFIG keeps a uv.toml on the host from adding
an index, as `pip --isolated` does in the image build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import cmd
from pipeline.build.lock import read_lock
from pipeline.build.plan import RequirementGroup, lock_groups, override_groups
from pipeline.build.render import image_file, render_template
from pipeline.cache import cache_dir, locked
from pipeline.errors import InfraError, InputError
from pipeline.guard.redact import redact
from pipeline.matrix.compilecache import host_slot_key
from pipeline.matrix.model import Cell, Matrix
from pipeline.matrix.site import Mirror, SiteSettings

__all__ = [
    "ENVS_DIR",
    "HostEnv",
    "HostEnvPlan",
    "Inventory",
    "build_host_env",
    "built_host_env",
    "given_env",
    "inventory",
    "plan_host_env",
]

ENVS_DIR = "envs"
COMPLETE = "stackproof-env.json"  # written last: an environment without it is an unfinished build
INSTALL_TIMEOUT_S = 3600
INTERPRETER_TIMEOUT_S = 120  # reading an inventory or what imports: seconds, not an hour

# Run by the environment's own python (stdlib only): what is installed, and which interpreter.
_INVENTORY = r"""
import hashlib, json, os, sys
from importlib import metadata
def sha(data): return hashlib.sha256(data).hexdigest()
packages = []
for dist in metadata.distributions():
    name = dist.metadata["Name"] or "?"
    record = dist.read_text("RECORD") or ""
    packages.append([name.lower().replace("_", "-"), dist.version, sha(record.encode())])
packages.sort()
exe = os.path.realpath(sys.executable)
with open(exe, "rb") as f:
    binary = sha(f.read())
print(json.dumps({"packages": packages, "interpreter": {"version": sys.version.split()[0],
    "implementation": sys.implementation.name, "executable": exe, "sha256": binary,
    "prefix": sys.prefix}}))
"""


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """What an environment holds, as its own python read it, and the digest over it."""

    digest: str
    python_version: str
    packages: tuple[tuple[str, str, str], ...]  # (name, version, sha256 of RECORD)
    executable: str

    @property
    def versions(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, version) for name, version, _ in self.packages)


@dataclass(frozen=True, kw_only=True)
class HostEnv:
    """A Python environment the host runtime serves from."""

    python: Path  # its interpreter (a venv's bin/python, or what --python named)
    root: Path | None  # the built environment's directory; None for a given one
    digest: str  # sha256:... over the inventory and the interpreter (`inventory`)
    python_version: str
    packages: int
    source: str  # "built" (this run), "local" (built before, same content) or "given" (--python)
    built_in_s: float | None = None
    versions: tuple[tuple[str, str], ...] = ()  # (name, version) of every package, from the inventory

    @property
    def files_root(self) -> Path | None:
        return self.root / "files" if self.root else None

    @property
    def ref(self) -> str:
        """What a receipt names in place of an image tag."""
        return f"host:{self.root or self.python}"

    @property
    def compile_cache_key(self) -> str:
        """Its slot in a site's compile cache (pipeline/matrix/compilecache.py `host_slot_key`): by the
        interpreter and the compiled packages' versions, else by the environment itself."""
        return host_slot_key(self.python_version, self.versions) or self.ref

    def to_json(self) -> dict[str, object]:
        return {
            "python": str(self.python),
            "root": str(self.root) if self.root else None,
            "digest": self.digest,
            "python_version": self.python_version,
            "packages": self.packages,
            "source": self.source,
        }


@dataclass(frozen=True, kw_only=True)
class HostEnvPlan:
    """What a host cell's environment is made of (pure): the same requirement files as its image."""

    cell: Cell
    python_version: str
    lock_groups: tuple[RequirementGroup, ...]
    override_groups: tuple[RequirementGroup, ...]
    recipes: tuple[tuple[str, str], ...]  # (name, the host script, rendered with placeholders)
    digest: str

    @property
    def name(self) -> str:
        return f"{self.cell.id}-{self.digest.removeprefix('sha256:')[:16]}"


def plan_host_env(matrix: Matrix, cell: Cell, images_dir: Path) -> HostEnvPlan:
    """The environment's content, and its name from it. A recipe without a host form is exit 2."""
    if cell.install is None:
        raise InputError(
            f"{matrix.file}:{cell.line}: cells[{cell.id}]: a host cell is built from `install:` (requirements and a "
            "lock); without one, verify an environment that exists: `stackproof verify CELL --runtime host --python PY`"
        )
    lock = read_lock(cell)
    locked_groups = lock_groups(lock, skip=set(cell.uninstall))
    overrides = override_groups(cell.overrides, lock)
    recipes = []
    for recipe in cell.recipes:
        template = images_dir / "recipes" / recipe / "host.j2"
        if not template.is_file():
            raise InputError(
                f"{matrix.file}:{cell.line}: cells[{cell.id}].recipes: recipe {recipe!r} has no host form "
                f"({template.relative_to(images_dir.parent) if images_dir.parent in template.parents else template})"
            )
        files = sorted(p for p in template.parent.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        content = hashlib.sha256(b"".join(p.name.encode() + image_file(p) for p in files)).hexdigest()
        recipes.append((recipe, content))
    inputs = {
        "python_version": cell.install.python_version,
        "lock": [g.text for g in locked_groups],
        "overrides": [g.text for g in overrides],
        "uninstall": list(cell.uninstall),
        "recipes": recipes,
    }
    digest = "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return HostEnvPlan(
        cell=cell,
        python_version=cell.install.python_version,
        lock_groups=locked_groups,
        override_groups=overrides,
        recipes=tuple(recipes),
        digest=digest,
    )


def built_host_env(plan: HostEnvPlan, *, envs_dir: Path | None = None) -> HostEnv | None:
    """The environment of this content, when a complete build of it is here."""
    return built_env_at((envs_dir or cache_dir() / ENVS_DIR) / plan.name)


def built_env_at(root: Path) -> HostEnv | None:
    """The environment built at `root` (a full environment or a layer), when its build completed:
    its interpreter's inventory, and the build time its marker recorded."""
    marker = root / COMPLETE
    if not marker.is_file():
        return None
    try:
        recorded = json.loads(marker.read_text())
    except ValueError:
        return None
    python = root / "venv" / "bin" / "python"
    identity = inventory(python)
    return HostEnv(
        python=python,
        root=root,
        digest=identity.digest,
        python_version=identity.python_version,
        packages=len(identity.packages),
        versions=identity.versions,
        source="local",
        built_in_s=recorded.get("built_in_s"),
    )


def build_host_env(
    plan: HostEnvPlan,
    site: SiteSettings,
    matrix: Matrix,
    images_dir: Path,
    *,
    interpreter: str | None = None,
    envs_dir: Path | None = None,
    log: Path | None = None,
) -> HostEnv:
    """Make the environment of `plan` (or reuse it); progress on stderr, uv's output in `log`."""
    envs = envs_dir or cache_dir() / ENVS_DIR
    with locked(envs):
        existing = built_host_env(plan, envs_dir=envs)
        if existing is not None:
            print(f"{plan.cell.id}: host environment {existing.root} is built (same content)", file=sys.stderr)
            return existing
        _check_system_packages(plan.cell, matrix)
        base_python = _interpreter(plan, matrix, interpreter)
        root = envs / plan.name
        shutil.rmtree(root, ignore_errors=True)  # an unfinished build of the same content
        started = time.monotonic()
        try:
            _make(
                plan,
                site,
                matrix,
                images_dir,
                base_python=base_python,
                root=root,
                log=log or root.parent / f"{plan.name}.log",
            )
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)  # nothing half-built is ever found as built
            raise
        seconds = round(time.monotonic() - started, 1)
        (root / COMPLETE).write_text(
            json.dumps({"cell": plan.cell.id, "digest": plan.digest, "built_in_s": seconds}) + "\n"
        )
    env = built_host_env(plan, envs_dir=envs)
    assert env is not None
    print(f"{plan.cell.id}: host environment built in {seconds:.0f}s: {root}", file=sys.stderr)
    return HostEnv(**{**env.__dict__, "source": "built", "built_in_s": seconds})


def given_env(python: str, *, where: str = "--python") -> HostEnv:
    """An environment that exists (`--python PY`): checked, never changed."""
    path = Path(python)
    resolved = Path(shutil.which(python) or python) if os.sep not in python else path
    if not resolved.exists():
        raise InputError(f"{where} {python}: no such file")
    if not os.access(resolved, os.X_OK) or resolved.is_dir():
        raise InputError(f"{where} {python}: not an executable file")
    identity = inventory(resolved.absolute(), where=f"{where} {python}")
    return HostEnv(
        python=resolved.absolute(),
        root=None,
        digest=identity.digest,
        python_version=identity.python_version,
        packages=len(identity.packages),
        versions=identity.versions,
        source="given",
    )


def inventory(python: Path, *, where: str | None = None) -> Inventory:
    """The environment's inventory as its own python reads it, with its digest. Run in its own
    process group (pipeline.cmd), ended with it: an interpreter that forks or hangs leaves nothing."""
    try:
        done = cmd.run([str(python), "-I", "-c", _INVENTORY], timeout=INTERPRETER_TIMEOUT_S, check=False, quiet=True)
    except (OSError, InfraError) as exc:
        raise InputError(
            f"{where or python}: cannot run it as a Python interpreter ({type(exc).__name__}: {exc})"
        ) from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[:300]
        raise InputError(f"{where or python}: not a working Python interpreter (exit {done.returncode}: {tail})")
    try:
        document = json.loads(done.stdout)
        packages = tuple((str(n), str(v), str(r)) for n, v, r in document["packages"])
        interpreter = {
            k: str(document["interpreter"][k]) for k in ("version", "implementation", "sha256", "executable")
        }
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{where or python}: the inventory script printed no readable JSON") from None
    canonical = json.dumps(
        {"packages": packages, "interpreter": {k: interpreter[k] for k in ("version", "implementation", "sha256")}},
        sort_keys=True,
    )
    return Inventory(
        digest="sha256:" + hashlib.sha256(canonical.encode()).hexdigest(),
        python_version=interpreter["version"],
        packages=packages,
        executable=interpreter["executable"],
    )


# -- the build steps (subprocess at the edge) --------------------------------------------------------


def _make(
    plan: HostEnvPlan, site: SiteSettings, matrix: Matrix, images_dir: Path, *, base_python: str, root: Path, log: Path
) -> None:
    uv = _uv()
    venv = root / "venv"
    python = venv / "bin" / "python"
    (root / "files").mkdir(parents=True)
    requirements = root / "requirements"
    requirements.mkdir()
    steps: list[tuple[str, list[str], dict[str, str]]] = [
        ("venv", [uv, "venv", "--no-python-downloads", "--python", base_python, str(venv)], {}),
    ]
    for group in plan.lock_groups:
        steps.append(_install_step(uv, python, group, requirements, site.index_location(matrix, group.index), site))
    if plan.cell.uninstall:
        steps.append(("uninstall", [uv, "pip", "uninstall", "--python", str(python), *plan.cell.uninstall], {}))
    for name, _ in plan.recipes:
        script = render_template(
            images_dir,
            f"recipes/{name}/host.j2",
            python=str(python),
            files=str(root / "files"),
            recipe=str((images_dir / "recipes" / name).resolve()),
            cell=plan.cell,
        )
        steps.append((f"recipe {name}", ["sh", "-eu", "-c", script], {}))
    for group in plan.override_groups:
        steps.append(_install_step(uv, python, group, requirements, site.index_location(matrix, group.index), site))
    with log.open("w") as out:
        for number, (title, argv, env) in enumerate(steps, 1):
            print(f"{plan.cell.id}: host environment step {number}/{len(steps)}: {title}", file=sys.stderr)
            out.write(f"# step {number}/{len(steps)}: {title}\n")
            out.flush()
            _step(title, argv, env, out, log, secrets=site.secrets())


def _install_step(
    uv: str, python: Path, group: RequirementGroup, requirements: Path, where: Mirror, site: SiteSettings
) -> tuple[str, list[str], dict[str, str]]:
    path = requirements / group.file
    path.write_text(group.text)
    argv = [uv, "pip", "install", "--python", str(python), "--no-deps", "-r", str(path)]
    if group.hashed:
        argv.append("--require-hashes")
    env = (
        {"UV_NO_INDEX": "1", "UV_FIND_LINKS": str(where.directory)}
        if where.is_local
        else {"UV_INDEX_URL": where.location}
    )
    if not where.is_local and where.location.startswith("http://"):
        env["UV_INSECURE_HOST"] = where.location.split("/")[2].rsplit("@", 1)[-1]
    if site.ca_bundle:
        env["SSL_CERT_FILE"] = str(site.ca_bundle)
    return f"install {group.count} package(s) from index {group.index}", argv, env


def _step(
    title: str, argv: list[str], env: dict[str, str], out: object, log: Path, *, secrets: tuple[str, ...]
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV", "PYTHON"))}
    full = {**clean, "UV_NO_CONFIG": "1", "UV_NO_CACHE": "1", "UV_LINK_MODE": "copy", **env}
    try:
        done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InfraError(
            f"host environment step {title!r} did not finish within {INSTALL_TIMEOUT_S}s (log: {log})"
        ) from None
    text = redact(done.stdout + done.stderr, secrets)
    out.write(text)  # type: ignore[attr-defined]
    if done.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-20:])
        raise InfraError(f"host environment step {title!r} failed (exit {done.returncode}); log: {log}\n{tail}")


def _uv() -> str:
    """The uv binary: the one installed with this tool (the `uv` package), else on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if found is None:
        raise InfraError("uv is needed to build a host environment: `pip install uv` (it installs with stackproof)")
    return found


def _interpreter(plan: HostEnvPlan, matrix: Matrix, given: str | None) -> str:
    """The base interpreter: `given`, else pythonX.Y on PATH, of the lock's Python version."""
    wanted = plan.python_version
    candidate = given or shutil.which(f"python{wanted}")
    if candidate is None:
        raise InfraError(
            f"cell {plan.cell.id!r} is locked for Python {wanted}: no python{wanted} on PATH; "
            "install it or pass --python"
        )
    version = inventory(Path(candidate), where=f"--python {candidate}" if given else candidate).python_version
    if ".".join(version.split(".")[:2]) != wanted:
        raise InputError(
            f"{matrix.file}:{plan.cell.line}: cells[{plan.cell.id}].install.python_version: the lock is for Python "
            f"{wanted}, and {candidate} is Python {version}"
        )
    return candidate


def _check_system_packages(cell: Cell, matrix: Matrix) -> None:
    """A host cell's `system_packages` must be installed already (a runner user cannot apt-get)."""
    if not cell.system_packages or shutil.which("dpkg-query") is None:
        return
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *cell.system_packages],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    installed = {line.split()[0].split(":")[0] for line in done.stdout.splitlines() if line.endswith(" installed")}
    missing = [p for p in cell.system_packages if p not in installed]
    if missing:
        raise InfraError(
            f"{matrix.file}:{cell.line}: cells[{cell.id}].system_packages: not installed on this host: "
            f"{', '.join(missing)} (as root: apt-get install {' '.join(missing)})"
        )


def given_differences(cell: Cell, versions: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Where an environment departs from the versions its cell says it is given (`given:`), one line
    each: a package absent, or at another version (compared as versions: 0.26 == 0.26.0)."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    here = {str(canonicalize_name(name)): version for name, version in versions}
    out = []
    for want in cell.given:
        found = here.get(want.name)
        if found is None:
            out.append(f"{want.name}: the cell is given {want.version}, the environment has none")
            continue
        try:
            same = Version(found) == Version(want.version)
        except InvalidVersion:
            same = found == want.version
        if not same:
            out.append(f"{want.name}: the cell is given {want.version}, the environment has {found}")
    return tuple(out)


def lock_differences(cell: Cell, versions: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Where an environment given for a locked cell (`--python`) departs from the cell's lock, one
    line each (issue 43: such an environment holding none of the lock passed `--stages imports`).
    What the cell uninstalls or overrides is not compared."""
    from packaging.utils import canonicalize_name

    if cell.install is None:
        return ()
    skipped = {str(canonicalize_name(n)) for n in cell.uninstall} | {r.name for r in cell.overrides}
    here = {str(canonicalize_name(name)): version for name, version in versions}
    try:
        lock = read_lock(cell)
    except InputError as exc:
        return (f"the cell's lock cannot be read: {exc}",)
    out = []
    for package in lock.packages:
        name = str(canonicalize_name(package.name))
        if name in skipped or here.get(name) == package.version:
            continue
        found = here.get(name)
        out.append(f"{name}: locked at {package.version}, the environment has {found or 'none'}")
    return tuple(out)


# Run by the environment's python: for each distribution named, which file `import TOP` would load
# for each of its top-level modules, and whether that file is one of the distribution's own.
_IMPORT_OWNER = r"""
import importlib.util, json, os, sys
from importlib import metadata
out = {}
for name in sys.argv[1:]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        out[name] = {"error": "not installed"}
        continue
    files = {os.path.realpath(dist.locate_file(f)) for f in (dist.files or ())}
    tops = (dist.read_text("top_level.txt") or "").split() or [name.replace("-", "_")]
    seen = []
    for top in tops:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError) as exc:
            seen.append([top, None, False]); continue
        origin = spec.origin if spec else None
        path = os.path.realpath(origin) if origin and os.path.exists(origin) else None
        seen.append([top, path, path in files])
    out[name] = {"version": dist.version, "modules": seen}
print(json.dumps(out))
"""


def import_differences(python: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """Where what imports is not what the metadata says (issue 43): `import vllm` must load a file of
    the installed vllm distribution, not a copy that shadows it (a directory on the path, a .pth)."""
    if not names:
        return ()
    done = cmd.run(
        [str(python), "-c", _IMPORT_OWNER, *names],
        timeout=INTERPRETER_TIMEOUT_S,
        check=False,
        quiet=True,
        cwd=Path("/"),
    )
    try:
        document = json.loads(done.stdout)
    except ValueError:
        return (f"{python}: could not tell what imports (exit {done.returncode})",)
    out = []
    for name in names:
        entry = document.get(name) if isinstance(document, dict) else None
        if not isinstance(entry, dict) or "modules" not in entry:
            continue  # not installed: given_differences says so
        for top, path, owned in entry["modules"]:
            if path is not None and not owned:
                out.append(
                    f"{name}: the metadata says {entry['version']}, and `import {top}` loads {path}, "
                    "which is none of that distribution's files"
                )
    return tuple(out)

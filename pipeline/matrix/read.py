"""Read matrix.yaml, apply inheritance, validate, and return the frozen `Matrix`.

One inheritance rule, applied in this order: `defaults`, then each `extends` ancestor from the
root down, then the cell itself. Mappings merge key by key (recursively); lists and scalars
replace; a `null` value removes the key. Every problem is collected and reported together as
`FILE:LINE: path: message`, with a did-you-mean for misspelled keys and names.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from pipeline.errors import InputError, MatrixError
from pipeline.guard.redact import secret_arg, secret_env
from pipeline.matrix.model import (
    DEFAULT_ENGINE,
    HOST_BASE,
    SERVING_ENGINES,
    STAGES,
    Arm,
    Base,
    BootstrapBase,
    BootstrapRecipe,
    Cell,
    CellBase,
    Expectation,
    ForensicsSpec,
    Index,
    Install,
    LoadSpec,
    LogRule,
    Matrix,
    ModelSource,
    RegistryBase,
    Requirement,
    ServeSpec,
    lineage,
    parse_log_rule,
)
from pipeline.matrix.yamlsrc import Path_, YamlSource, format_path, load_yaml

__all__ = ["KNOWN_ARCHES", "MAX_CONCURRENCY", "MAX_COUNT", "MAX_SECONDS", "SCHEMA_VERSION", "load_matrix"]

SCHEMA_VERSION = 1
KNOWN_ARCHES = ("none", "sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")
PLATFORMS = ("linux/amd64", "linux/arm64")
TOP_KEYS = ("schema_version", "indexes", "bases", "defaults", "cells")
CELL_KEYS = (
    "id",
    "extends",
    "description",
    "base",
    "platform",
    "arch",
    "runner",
    "system_packages",
    "install",
    "overrides",
    "uninstall",
    "recipes",
    "env",
    "serve",
    "arms",
    "expect",
    "imports",
    "accepted_conflicts",
    "log_rules",
    "autotune",
    "runtime",
    "given",
)
AUTOTUNE_ENTRIES = ("expected", "none")
RUNTIMES = ("docker", "host")  # verify/runtime/: an image's container, or a process group on the host
INHERITABLE_KEYS = tuple(k for k in CELL_KEYS if k not in ("id", "extends"))
REQUIRED_CELL_KEYS = ("base", "platform", "arch")
PACKAGE_KEYS = ("version", "index")
INSTALL_KEYS = ("requirements", "lock", "python_version", "python_platform")
SERVE_KEYS = ("engine", "model", "args", "env", "readiness_timeout", "shm_size", "gpus", "load", "forensics")
FORENSICS_KEYS = ("cuda_coredump",)
# serve.load keys: the LoadSpec field, with `_s` dropped from durations; `determinism` is a sub-mapping.
LOAD_KEYS = (
    *tuple(f.name.removesuffix("_s") for f in dataclasses.fields(LoadSpec) if not f.name.startswith("determinism_")),
    "determinism",
)
DETERMINISM_KEYS = ("prompts", "repeats", "max_tokens")
MODEL_KEYS = ("source", "revision")
ARM_KEYS = ("description", "env", "args", "log_rules")
EXPECT_KEYS = ("outcome", "stage", "reason", "match", "may_not_reproduce")
EXPECT_REQUIRED = ("outcome", "stage", "reason", "match")
INDEX_KEYS = ("url",)
REGISTRY_BASE_KEYS = ("image", "digest", "python", "require_cuda", "platforms")
BOOTSTRAP_KEYS = ("suite", "variant", "include", "venv")
TOOL_OWNED_ARGS = ("--host", "--port")  # the tool binds the server to 127.0.0.1 on a port it picks

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")  # a path component and a tag repository: short, no `/`
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PACKAGE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_MODEL = re.compile(r"^(hf:[\w.-]+/[\w.-]+|path:/\S+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Strings that reach a Dockerfile `RUN` line or a file name: strict, then quoted when rendered too.
_DEB_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}(=[A-Za-z0-9.+~:-]{1,100})?$")
_ABS_PATH = re.compile(r"^(/[A-Za-z0-9._+-]+)+$")
_PYTHON = re.compile(r"^[A-Za-z0-9._+-]+$|^(/[A-Za-z0-9._+-]+)+$")
_SUITE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Upper bounds: a typo or a hostile file must not buy unbounded memory or time (issue 16).
MAX_CONCURRENCY = 4096
MAX_COUNT = 1_000_000  # questions, tokens, errors, prompts, repeats
MAX_SECONDS = 7 * 24 * 3600.0
MAX_CHAIN = 32  # extends ancestors, and cells stacked on cells as bases


def load_matrix(file: Path, *, images_dir: Path | None = None) -> Matrix:
    """Load and validate `file`; raise `MatrixError` listing every problem, located."""
    file = Path(file)
    src = load_yaml(file)
    checker = _Checker(src, images_dir or file.parent / "images")
    matrix = checker.matrix()
    if checker.problems:
        raise MatrixError(checker.problems)
    assert matrix is not None
    return matrix


class _Checker:
    """Walks the document once, building typed values and collecting located problems."""

    def __init__(self, src: YamlSource, images_dir: Path) -> None:
        self.src = src
        self.images_dir = images_dir
        self.problems: list[str] = []
        self._seen: set[str] = set()  # problems already reported: a set, so 300,000 of them stay linear
        self.origins: dict[Path_, Path_] = {}  # merged cell path -> where in the file it came from

    # -- reporting --------------------------------------------------------------------------------

    def problem(self, path: Path_, message: str) -> None:
        where = self.origins.get(path, path)
        line = f"{self.src.file}:{self.src.line_of(where)}: {format_path(where)}: {message}"
        if line not in self._seen:  # a mistake in `defaults` or an ancestor is reported once
            self._seen.add(line)
            self.problems.append(line)

    def keys(self, path: Path_, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> bool:
        """Check `value` is a mapping with only `allowed` keys and all `required` ones."""
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping, got {_kind(value)}")
            return False
        for key in value:
            if key not in allowed:
                self.problem((*path, key), f"unknown key{_did_you_mean(str(key), allowed)}")
        missing = [key for key in required if key not in value]
        for key in missing:
            self.problem(path, f"missing required key {key!r}")
        return not missing

    # -- scalars ----------------------------------------------------------------------------------

    def text(self, path: Path_, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
        if isinstance(value, bool) or value is None or isinstance(value, dict | list):
            self.problem(path, f"must be a string, got {_kind(value)}")
            return ""
        text = self.src.text_of(self.origins.get(path, path)) or str(value)
        if pattern is not None and not pattern.match(text):
            self.problem(path, f"{text!r} is not a valid {what or 'value'}")
        return text

    def choice(self, path: Path_, value: Any, choices: tuple[str, ...], what: str) -> str:
        text = self.text(path, value)
        if value is not None and not isinstance(value, dict | list | bool) and not text:
            self.problem(path, f"must not be empty (one of {', '.join(choices)})")
        if text and text not in choices:
            self.problem(path, f"unknown {what} {text!r}{_did_you_mean(text, choices)}")
        return text

    def texts(
        self, path: Path_, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = ""
    ) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(path, f"must be a list, got {_kind(value)}")
            return ()
        return tuple(self.text((*path, i), item, pattern=pattern, what=what) for i, item in enumerate(value))

    def env(self, path: Path_, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of NAME: value, got {_kind(value)}")
            return ()
        pairs = []
        for name, item in value.items():
            if not _ENV_NAME.match(str(name)):
                self.problem((*path, name), f"{name!r} is not a valid environment variable name")
            text = self.text((*path, name), item)
            if _CONTROL.search(text):
                self.problem((*path, name), "the value holds a control character (newline, tab, escape...)")
            secret = secret_env(str(name), text)
            if secret:
                self.problem((*path, name), f"refused: {secret}; a secret never goes into matrix.yaml or an image")
            pairs.append((str(name), text))
        return tuple(sorted(pairs))

    def log_rules(self, path: Path_, value: Any, *, prefix: str) -> tuple[LogRule, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(path, f"must be a list of rules like {{expect: 'regex'}}, got {_kind(value)}")
            return ()
        rules = []
        for j, item in enumerate(value):
            rule, problems = parse_log_rule(item, default_id=f"{prefix}-{j}")
            for sub, message in problems:
                self.problem((*path, j, *sub), message)
            if rule is not None:
                rules.append(rule)
        return tuple(rules)

    def autotune_entries(self, path: Path_, value: Any) -> str:
        """`autotune.entries`: whether a fresh start must tune something (default) or may tune nothing."""
        if not isinstance(value, dict) or "entries" not in value:
            return "expected"
        return self.choice((*path, "entries"), value["entries"], AUTOTUNE_ENTRIES, "autotune entries") or "expected"

    def autotune(self, path: Path_, value: Any) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        """`{forbid: [{op, runner}], allow: [{op, runner}]}` on top of the built-in autotune policies."""
        if value is None or not self.keys(path, value, ("forbid", "allow", "entries")):
            return (), ()
        lists = []
        for key in ("forbid", "allow"):
            pairs = []
            items = value.get(key) or []
            if not isinstance(items, list):
                self.problem((*path, key), f"must be a list of {{op, runner}}, got {_kind(items)}")
                items = []
            for j, item in enumerate(items):
                if self.keys((*path, key, j), item, ("op", "runner"), required=("op", "runner")):
                    pairs.append(
                        (
                            self.text((*path, key, j, "op"), item["op"]),
                            self.text((*path, key, j, "runner"), item["runner"]),
                        )
                    )
            lists.append(tuple(pairs))
        return lists[0], lists[1]

    def regex(self, path: Path_, value: Any) -> str:
        text = self.text(path, value)
        try:
            re.compile(text)
        except re.error as exc:
            self.problem(path, f"{text!r} is not a valid regular expression: {exc}")
        return text

    def env_like(self, path: Path_, value: Any, what: str) -> tuple[tuple[str, str], ...]:
        """A mapping of name: text (not environment names), e.g. accepted_conflicts."""
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of {what}, got {_kind(value)}")
            return ()
        return tuple((str(k), self.text((*path, k), v)) for k, v in value.items())

    def path(self, path: Path_, value: Any) -> str:
        """An absolute path inside an image, made of plain name characters (it is rendered into `RUN`)."""
        text = self.text(path, value, pattern=_ABS_PATH, what="absolute path (letters, digits, . _ + -)")
        if ".." in text.split("/"):
            self.problem(path, f"{text!r}: no `..` in the path")
        return text

    def version(self, path: Path_, value: Any) -> str:
        """An exact version, normalised once here (`1.16.0-post1` -> `1.16.0.post1`)."""
        text = self.text(path, value)
        try:
            return str(Version(text))
        except InvalidVersion:
            self.problem(path, f"{text!r} is not an exact version (write one version, e.g. '0.6.18.post1')")
        return text

    # -- document ---------------------------------------------------------------------------------

    def matrix(self) -> Matrix | None:
        data = self.src.data
        if not self.keys((), data, TOP_KEYS, required=("schema_version", "cells")):
            return None
        version = data.get("schema_version")
        if "schema_version" in data and version != SCHEMA_VERSION:
            self.problem(
                ("schema_version",), f"unsupported schema_version {version!r} (this tool reads {SCHEMA_VERSION})"
            )
            return None
        indexes = self.indexes(data.get("indexes") or {})
        bases = self.bases(data.get("bases") or {})
        raw_cells = data.get("cells")
        if not isinstance(raw_cells, list):
            self.problem(("cells",), f"must be a list of cells, got {_kind(raw_cells)}")
            return None
        defaults = data.get("defaults") or {}
        if "defaults" in data:
            self.keys(("defaults",), defaults, INHERITABLE_KEYS)
        cells = self.cells(raw_cells, defaults, indexes, bases)
        digest = "sha256:" + hashlib.sha256(self.src.file.read_bytes()).hexdigest()
        return Matrix(file=self.src.file, digest=digest, indexes=indexes, bases=bases, cells=cells)

    def indexes(self, value: Any) -> tuple[Index, ...]:
        if not isinstance(value, dict):
            self.problem(("indexes",), f"must be a mapping of name: {{url: ...}}, got {_kind(value)}")
            return ()
        result = []
        for name, spec in value.items():
            path: Path_ = ("indexes", name)
            if not _ID.match(str(name)):
                self.problem(path, f"{str(name)[:80]!r} is not a valid index name (lower case, digits, . _ -)")
            if self.keys(path, spec, INDEX_KEYS, required=INDEX_KEYS):
                url = self.text((*path, "url"), spec.get("url"))
                if url and not url.startswith(("https://", "http://", "file://")):
                    self.problem((*path, "url"), f"{url!r} is not an http(s) or file URL")
                elif url and (_CONTROL.search(url) or " " in url):
                    self.problem((*path, "url"), "the URL holds a space or a control character")
                elif url and secret_arg("--index-url", url):
                    self.problem(
                        (*path, "url"), "refused: the URL carries credentials; give them in STACKPROOF_MIRRORS"
                    )
                result.append(Index(name=str(name), url=url))
        return tuple(result)

    def bases(self, value: Any) -> tuple[Base, ...]:
        if not isinstance(value, dict):
            self.problem(("bases",), f"must be a mapping of name: base, got {_kind(value)}")
            return ()
        result: list[Base] = []
        for name, spec in value.items():
            path: Path_ = ("bases", name)
            if not isinstance(spec, dict):
                self.problem(path, f"must be a mapping, got {_kind(spec)}")
            elif "bootstrap" in spec:
                if self.keys(path, spec, ("bootstrap",)) and self.keys(
                    (*path, "bootstrap"), spec["bootstrap"], BOOTSTRAP_KEYS, required=("suite", "venv")
                ):
                    b = spec["bootstrap"]
                    bp = (*path, "bootstrap")
                    recipe = BootstrapRecipe(
                        suite=self.text((*bp, "suite"), b.get("suite"), pattern=_SUITE, what="Debian suite"),
                        variant=self.text(
                            (*bp, "variant"), b.get("variant", "minbase"), pattern=_SUITE, what="debootstrap variant"
                        ),
                        include=self.texts(
                            (*bp, "include"), b.get("include"), pattern=_DEB_PACKAGE, what="Debian package name"
                        ),
                        venv=self.path((*bp, "venv"), b.get("venv")),
                    )
                    result.append(BootstrapBase(name=str(name), recipe=recipe))
            elif "cell" in spec:
                if self.keys(path, spec, ("cell",)):
                    result.append(CellBase(name=str(name), cell=self.text((*path, "cell"), spec["cell"])))
            elif self.keys(path, spec, REGISTRY_BASE_KEYS, required=("image",)):
                image = self.text((*path, "image"), spec.get("image"), pattern=_IMAGE, what="image repository:tag")
                digest = None
                if spec.get("digest") is not None:
                    digest = self.text((*path, "digest"), spec["digest"], pattern=_DIGEST, what="sha256 digest")
                python = self.text(
                    (*path, "python"), spec.get("python", "python3"), pattern=_PYTHON, what="python command or path"
                )
                if ".." in python.split("/"):
                    self.problem((*path, "python"), f"{python!r}: no `..` in the python path")
                require_cuda = None
                if spec.get("require_cuda") is not None:
                    require_cuda = self.text((*path, "require_cuda"), spec["require_cuda"])
                platforms = self.texts((*path, "platforms"), spec.get("platforms"))
                for i, item in enumerate(platforms):
                    if item not in PLATFORMS:
                        self.problem(
                            (*path, "platforms", i), f"unknown platform {item!r}{_did_you_mean(item, PLATFORMS)}"
                        )
                result.append(
                    RegistryBase(
                        name=str(name),
                        image=image,
                        digest=digest,
                        python=python,
                        require_cuda=require_cuda,
                        platforms=platforms,
                    )
                )
        return tuple(result)

    # -- cells ------------------------------------------------------------------------------------

    def cells(
        self, raw_cells: list[Any], defaults: Any, indexes: tuple[Index, ...], bases: tuple[Base, ...]
    ) -> tuple[Cell, ...]:
        by_id: dict[str, int] = {}
        ids: dict[int, str] = {}  # index -> the id as written (`id: 123` is the id "123", not dropped)
        for i, raw in enumerate(raw_cells):
            if not self.keys(("cells", i), raw, CELL_KEYS, required=("id",)):
                continue
            cell_id = self.text(("cells", i, "id"), raw.get("id"), pattern=_ID, what="cell id")
            if cell_id:
                ids[i] = cell_id
            if cell_id in by_id:
                first = self.src.line_of(("cells", by_id[cell_id]))
                self.problem(("cells", i, "id"), f"duplicate cell id {cell_id!r} (first defined at line {first})")
            elif cell_id:
                by_id[cell_id] = i
        cells = []
        cell_ids = set(by_id)  # once: a set per cell made validation quadratic in the cell count
        for i in range(len(raw_cells)):
            if i not in ids or by_id.get(ids[i]) != i:
                continue
            chain = self.extends_chain(i, raw_cells, by_id, ids)
            if chain is None:
                continue
            layers: list[tuple[Path_, Any]] = []
            if isinstance(defaults, dict):
                layers.append((("defaults",), defaults))
            layers += [(("cells", j), {k: v for k, v in raw_cells[j].items() if k in INHERITABLE_KEYS}) for j in chain]
            merged, origins = _merge(layers)
            self.origins = {("cells", i, *rel): where for rel, where in origins.items()}
            cell = self.cell(i, ids[i], merged, indexes, bases, cell_ids)
            self.origins = {}
            if cell is not None:
                cells.append(cell)
        self.base_cells_exist(bases, set(by_id))
        if not self.base_chains_bounded(cells, by_id):
            return tuple(cells)
        return _inherit_accepted_conflicts(cells, bases)

    def base_chains_bounded(self, cells: list[Cell], index: dict[str, int]) -> bool:
        """No cell is its own base, however far round, and no chain is more than MAX_CHAIN deep
        (each level is an image build)."""
        by_id = {c.id: c for c in cells}
        ok = True
        for cell in cells:
            if isinstance(cell.base, CellBase) and cell.base.cell == cell.id:
                ok = False  # said already, as "this cell's own image"
                continue
            where = ("cells", index[cell.id], "base")
            try:
                chain = lineage(cell, by_id, limit=MAX_CHAIN)
            except InputError as exc:
                self.problem(where, str(exc))
                ok = False
                continue
            if len(chain) - 1 > MAX_CHAIN:
                self.problem(where, f"more than {MAX_CHAIN} cells stacked as bases")
                ok = False
        return ok

    def extends_chain(
        self, i: int, raw_cells: list[Any], by_id: dict[str, int], ids: dict[int, str]
    ) -> list[int] | None:
        """Indexes of the cell's ancestors, root first, ending with the cell itself."""
        chain = [i]
        while "extends" in raw_cells[chain[0]]:
            j = chain[0]
            written = raw_cells[j]["extends"]
            if isinstance(written, dict | list) or written is None or isinstance(written, bool):
                self.problem(("cells", j, "extends"), f"must be a cell id, got {_kind(written)}")
                return None
            parent = self.src.text_of(("cells", j, "extends")) or str(written)
            if parent not in by_id:
                self.problem(("cells", j, "extends"), f"no cell {parent!r}{_did_you_mean(str(parent), tuple(by_id))}")
                return None
            if len(chain) > MAX_CHAIN:
                self.problem(("cells", i, "extends"), f"an extends chain of more than {MAX_CHAIN} cells")
                return None
            if by_id[parent] in chain:
                names = " -> ".join(ids[k] for k in [by_id[parent], *chain])
                self.problem(("cells", j, "extends"), f"extends cycle: {names}")
                return None
            chain.insert(0, by_id[parent])
        return chain

    def cell(
        self,
        i: int,
        cell_id: str,
        data: dict[str, Any],
        indexes: tuple[Index, ...],
        bases: tuple[Base, ...],
        cell_ids: set[str],
    ) -> Cell | None:
        p: Path_ = ("cells", i)
        runtime = self.choice((*p, "runtime"), data.get("runtime", "docker"), RUNTIMES, "runtime") or "docker"
        on_host = runtime == "host"
        required = tuple(k for k in REQUIRED_CELL_KEYS if not (on_host and k == "base"))
        for key in required:
            if key not in data:
                self.problem(p, f"missing required key {key!r} (set it in the cell, an ancestor or defaults)")
        index_names = tuple(ix.name for ix in indexes)
        base_names = tuple(b.name for b in bases)
        notes: list[str] = []

        base: Base | None = HOST_BASE if on_host else None
        if "base" in data and on_host:
            self.problem(
                (*p, "base"),
                "a `runtime: host` cell has no base image: its environment is built from `install:` "
                "(or given with `verify --python`); remove `base`",
            )
        elif "base" in data:
            base_name = self.text((*p, "base"), data["base"])
            base = next((b for b in bases if b.name == base_name), None)
            if base is None:
                self.problem((*p, "base"), f"no base {base_name!r}{_did_you_mean(base_name, base_names)}")
            elif isinstance(base, CellBase) and base.cell == cell_id:
                self.problem((*p, "base"), f"base {base_name!r} is this cell's own image")
            elif isinstance(base, RegistryBase) and base.digest is None:
                notes.append(f"base {base.image} is pinned by tag only; the build records the digest it got")

        install = self.install((*p, "install"), data.get("install"), index_names) if "install" in data else None
        overrides = self.packages((*p, "overrides"), data.get("overrides"), index_names)
        given = self.packages((*p, "given"), data.get("given"), index_names)
        if given and not on_host:
            self.problem((*p, "given"), "only a `runtime: host` cell is verified in an environment it is given")
        elif given and "install" in data:
            self.problem((*p, "given"), "a cell with `install:` builds its environment: `given` is for one that exists")
        serve = self.serve((*p, "serve"), data["serve"]) if data.get("serve") is not None else None
        expect = None
        if data.get("expect") is not None and self.keys(
            (*p, "expect"), data["expect"], EXPECT_KEYS, required=EXPECT_REQUIRED
        ):
            e = data["expect"]
            self.choice((*p, "expect", "outcome"), e.get("outcome"), ("fail",), "expected outcome")
            expect = Expectation(
                stage=self.choice((*p, "expect", "stage"), e.get("stage"), STAGES, "stage"),
                reason=self.text((*p, "expect", "reason"), e.get("reason")),
                match=self.regex((*p, "expect", "match"), e.get("match")),
                may_not_reproduce=(
                    self.text((*p, "expect", "may_not_reproduce"), e["may_not_reproduce"])
                    if e.get("may_not_reproduce") is not None
                    else None
                ),
            )
        recipes = self.texts((*p, "recipes"), data.get("recipes"), pattern=_ID, what="recipe name")
        for j, recipe in enumerate(recipes):
            if recipe and _ID.match(recipe) and not (self.images_dir / "recipes" / recipe / "steps.j2").is_file():
                known = tuple(d.parent.name for d in (self.images_dir / "recipes").glob("*/steps.j2"))
                self.problem(
                    (*p, "recipes", j), f"no recipe {recipe!r} in images/recipes/{_did_you_mean(recipe, known)}"
                )

        # Every field is checked before giving up on the cell, so all its problems show at once.
        platform = self.choice((*p, "platform"), data["platform"], PLATFORMS, "platform") if "platform" in data else ""
        arch = self.choice((*p, "arch"), data["arch"], KNOWN_ARCHES, "arch") if "arch" in data else ""
        if serve is not None and serve.forensics.cuda_coredump and arch == "none":
            self.problem(
                (*p, "serve", "forensics", "cuda_coredump"),
                "needs a GPU cell: arch is none, and a CPU server has no CUDA context to dump",
            )
        runner = self.texts((*p, "runner"), data.get("runner"))
        system_packages = self.texts(
            (*p, "system_packages"), data.get("system_packages"), pattern=_DEB_PACKAGE, what="Debian package name"
        )
        uninstall = tuple(
            str(canonicalize_name(n))
            for n in self.texts((*p, "uninstall"), data.get("uninstall"), pattern=_PACKAGE, what="package name")
        )
        env = self.env((*p, "env"), data.get("env"))
        arms = self.arms((*p, "arms"), data.get("arms"))
        engine = serve.engine if serve is not None else DEFAULT_ENGINE
        imports = self.texts((*p, "imports"), data["imports"]) if "imports" in data else SERVING_ENGINES[engine]
        accepted = self.env_like((*p, "accepted_conflicts"), data.get("accepted_conflicts"), "package: reason")
        log_rules = self.log_rules((*p, "log_rules"), data.get("log_rules"), prefix=cell_id)
        forbid, allow = self.autotune((*p, "autotune"), data.get("autotune"))
        autotune_entries = self.autotune_entries((*p, "autotune"), data.get("autotune"))
        if base is None or any(k not in data for k in required):
            return None
        return Cell(
            id=cell_id,
            line=self.src.line_of(p),
            base=base,
            platform=platform,
            arch=arch,
            runner=runner,
            system_packages=system_packages,
            install=install,
            overrides=overrides,
            uninstall=uninstall,
            recipes=recipes,
            env=env,
            serve=serve,
            arms=arms,
            expect=expect,
            imports=imports,
            accepted_conflicts=tuple(sorted((str(canonicalize_name(k)), v) for k, v in accepted)),
            log_rules=log_rules,
            autotune_forbid=forbid,
            autotune_allow=allow,
            autotune_entries=autotune_entries,
            notes=tuple(notes),
            runtime=runtime,
            given=given,
        )

    def packages(self, path: Path_, value: Any, index_names: tuple[str, ...]) -> tuple[Requirement, ...]:
        """`name: {version, index}` mappings (overrides and install requirements)."""
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of package: {{version, index}}, got {_kind(value)}")
            return ()
        result = []
        for name, spec in value.items():
            item: Path_ = (*path, name)
            if not _PACKAGE.match(str(name)):
                self.problem(item, f"{name!r} is not a valid package name")
            if not self.keys(item, spec, PACKAGE_KEYS, required=PACKAGE_KEYS):
                continue
            version = self.version((*item, "version"), spec.get("version"))
            index = self.text((*item, "index"), spec.get("index"))
            if index and index not in index_names:
                self.problem((*item, "index"), f"undeclared index {index!r}{_did_you_mean(index, index_names)}")
            result.append(Requirement(name=str(canonicalize_name(str(name))), version=version, index=index))
        return tuple(sorted(result, key=lambda r: r.name))

    def install(self, path: Path_, value: Any, index_names: tuple[str, ...]) -> Install | None:
        if not self.keys(path, value, INSTALL_KEYS, required=("requirements", "lock")):
            return None
        lock = self.text((*path, "lock"), value.get("lock"))
        return Install(
            requirements=self.packages((*path, "requirements"), value.get("requirements"), index_names),
            lock=(self.src.file.parent / lock).resolve(),
            python_version=self.text((*path, "python_version"), value.get("python_version", "3.11")),
            python_platform=self.text(
                (*path, "python_platform"), value.get("python_platform", "x86_64-manylinux_2_28")
            ),
        )

    def serve(self, path: Path_, value: Any) -> ServeSpec | None:
        if not self.keys(path, value, SERVE_KEYS, required=("model",)):
            return None
        model = value.get("model")
        source = ModelSource(source="", revision=None)
        if self.keys((*path, "model"), model, MODEL_KEYS, required=("source",)):
            text = self.text(
                (*path, "model", "source"),
                model.get("source"),
                pattern=_MODEL,
                what="model source (hf:org/name or path:/dir/in/image)",
            )
            source = ModelSource(source=text, revision=self.revision((*path, "model"), text, model.get("revision")))
        args = self.texts((*path, "args"), value.get("args"))
        self.tool_owned(path, args)
        engine = self.engine((*path, "engine"), value.get("engine", DEFAULT_ENGINE))
        timeout = value.get("readiness_timeout", 600)
        if not _finite_in(timeout, 0, MAX_SECONDS):
            self.problem(
                (*path, "readiness_timeout"),
                f"must be a positive number of seconds, got {_shown(timeout)}"
                + ("" if _finite_in(timeout, -math.inf, 0, zero_ok=True) else f" (finite, at most {MAX_SECONDS:.0f})"),
            )
            timeout = 600
        return ServeSpec(
            model=source,
            args=args,
            env=self.env((*path, "env"), value.get("env")),
            readiness_timeout_s=float(timeout),
            shm_size=self.text((*path, "shm_size"), value.get("shm_size", "1g")),
            gpus=None if value.get("gpus") is None else self.text((*path, "gpus"), value["gpus"]),
            load=self.load_spec((*path, "load"), value.get("load")),
            forensics=self.forensics((*path, "forensics"), value.get("forensics")),
            engine=engine,
        )

    def engine(self, path: Path_, value: Any) -> str:
        """`serve.engine`: one of the engines with a driver (SERVING_ENGINES), with a did-you-mean."""
        if not isinstance(value, str) or value not in SERVING_ENGINES:
            known = tuple(SERVING_ENGINES)
            shown = _did_you_mean(value, known) if isinstance(value, str) else ""
            self.problem(path, f"unknown serving engine {_shown(value)}{shown} (known: {', '.join(known)})")
            return DEFAULT_ENGINE
        return value

    def forensics(self, path: Path_, value: Any) -> ForensicsSpec:
        """`serve.forensics`: `{cuda_coredump: true|false}` (default false)."""
        if value is None or not self.keys(path, value, FORENSICS_KEYS):
            return ForensicsSpec()
        coredump = value.get("cuda_coredump", False)
        if not isinstance(coredump, bool):
            self.problem((*path, "cuda_coredump"), f"must be true or false, got {_kind(coredump)}")
            coredump = False
        return ForensicsSpec(cuda_coredump=coredump)

    def revision(self, path: Path_, source: str, value: Any) -> str | None:
        """An `hf:` model names the commit it is served at: a branch or tag moves under the store and the
        receipt, a commit does not. A `path:` model is in the image, so a revision would mean nothing."""
        where = (*path, "revision")
        if source.startswith("path:"):
            if value is not None:
                self.problem(where, "a path: model is part of the image and takes no revision")
            return None
        if not source.startswith("hf:"):
            return None  # the source itself was reported
        if value is None:
            self.problem(where, f"missing: {source} needs the 40-hex commit hash it is served at")
            return None
        text = self.text(where, value)
        if text and not _COMMIT.match(text):
            self.problem(where, f"{text!r} is not a commit hash (40 hex digits); a branch or tag can move")
        return text

    def load_spec(self, path: Path_, value: Any) -> LoadSpec:
        """`serve.load`: every key optional, each checked against the type of LoadSpec's default."""
        if value is None or not self.keys(path, value, LOAD_KEYS):
            return LoadSpec()
        # Unknown keys were reported by keys(); only the known ones are read.
        flat = {k: v for k, v in value.items() if k in LOAD_KEYS and k != "determinism"}
        where = {k: (*path, k) for k in flat}
        det = value.get("determinism")
        if det is not None and self.keys((*path, "determinism"), det, DETERMINISM_KEYS):
            known = {k: v for k, v in det.items() if k in DETERMINISM_KEYS}
            flat.update({f"determinism_{k}": v for k, v in known.items()})
            where.update({f"determinism_{k}": (*path, "determinism", k) for k in known})
        fields = {f.name: f for f in dataclasses.fields(LoadSpec)}
        chosen: dict[str, Any] = {}
        for key, raw in flat.items():
            name = key if key in fields else f"{key}_s"
            default = fields[name].default
            at = where[key]
            if name == "baseline_rate":
                chosen[name] = self.probability(at, raw)
            elif name == "canary_floor":
                chosen[name] = self.share(at, raw)
            elif name == "questions_file":
                file = (self.src.file.parent / self.text(at, raw)).resolve()
                if not file.is_file():
                    self.problem(at, f"no such file: {file}")
                chosen[name] = str(file)
            elif isinstance(default, bool):
                if not isinstance(raw, bool):
                    self.problem(at, f"must be true or false, got {raw!r}")
                chosen[name] = bool(raw)
            elif isinstance(default, int) and name != "rate":
                low = 0 if name == "seed" else 1
                high = MAX_CONCURRENCY if name == "concurrency" else 2**63 - 1 if name == "seed" else MAX_COUNT
                ok = isinstance(raw, int) and not isinstance(raw, bool) and low <= raw <= high
                if not ok and isinstance(raw, int) and not isinstance(raw, bool) and raw > high:
                    self.problem(at, f"must be at most {high:,}, got {_shown(raw)}")
                elif not ok:
                    self.problem(
                        at, f"must be a {'non-negative' if name == 'seed' else 'positive'} integer, got {_shown(raw)}"
                    )
                chosen[name] = raw if ok else default
            else:  # seconds, rates, burstiness: finite positive numbers (warmup may be 0)
                top = MAX_SECONDS if name.endswith("_s") or name == "stall_seconds" else float(MAX_COUNT)
                ok = _finite_in(raw, 0, top, zero_ok=name == "warmup_s")
                if not ok and _finite_in(raw, top, math.inf):
                    self.problem(at, f"must be at most {top:,.0f}, got {_shown(raw)}")
                elif not ok and isinstance(raw, float) and not math.isfinite(raw):
                    self.problem(at, f"must be a finite number, got {_shown(raw)}")
                elif not ok:
                    self.problem(at, f"must be a positive number, got {_shown(raw)}")
                chosen[name] = float(raw) if ok else default
        return LoadSpec(**chosen)

    def probability(self, path: Path_, value: Any) -> float:
        """`1/450` or `0.00222`: a fault probability per question."""
        text = str(value).strip()
        try:
            number = float(Fraction(text))
        except (ValueError, ZeroDivisionError, OverflowError):
            number = -1.0
        if not 0 < number < 1:
            self.problem(path, f"{text!r} is not a probability: write a fraction (1/450) or a decimal (0.00222)")
            return LoadSpec.baseline_rate
        return number

    def share(self, path: Path_, value: Any) -> float | None:
        """A share of answers in (0, 1]: `0.75`."""
        if not _finite_in(value, 0, 1):
            self.problem(path, f"must be a share of answers above 0 and at most 1 (e.g. 0.75), got {_shown(value)}")
            return None
        return float(value)

    def tool_owned(self, path: Path_, args: tuple[str, ...]) -> None:
        """Flags the tool owns, and credentials (which would reach `ps`, inspect and server.log)."""
        for j, arg in enumerate(args):
            if arg.split("=", 1)[0] in TOOL_OWNED_ARGS:
                self.problem((*path, "args", j), f"{arg!r}: the tool sets --host 127.0.0.1 and --port itself")
            if _CONTROL.search(arg):
                self.problem((*path, "args", j), "the argument holds a control character (newline, tab, escape...)")
            following = args[j + 1] if j + 1 < len(args) and not args[j + 1].startswith("-") else None
            secret = secret_arg(arg, following if arg.startswith("-") and "=" not in arg else None)
            if secret:
                self.problem(
                    (*path, "args", j), f"refused: {secret}; a secret never goes into matrix.yaml or the server's argv"
                )

    def arms(self, path: Path_, value: Any) -> tuple[Arm, ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of arm name: {{env, args}}, got {_kind(value)}")
            return ()
        result = []
        for name, spec in value.items():
            item: Path_ = (*path, name)
            if not _ID.match(str(name)):
                self.problem(item, f"{name!r} is not a valid arm name")
            spec = spec or {}
            if self.keys(item, spec, ARM_KEYS):
                args = self.texts((*item, "args"), spec.get("args"))
                self.tool_owned(item, args)
                result.append(
                    Arm(
                        log_rules=self.log_rules((*item, "log_rules"), spec.get("log_rules"), prefix=str(name)),
                        name=str(name),
                        description=self.text((*item, "description"), spec.get("description", "")),
                        env=self.env((*item, "env"), spec.get("env")),
                        args=args,
                    )
                )
        return tuple(result)

    def base_cells_exist(self, bases: tuple[Base, ...], cell_ids: set[str]) -> None:
        for base in bases:
            if isinstance(base, CellBase) and base.cell not in cell_ids:
                self.problem(
                    ("bases", base.name, "cell"), f"no cell {base.cell!r}{_did_you_mean(base.cell, tuple(cell_ids))}"
                )


def _merge(layers: list[tuple[Path_, Any]]) -> tuple[dict[str, Any], dict[Path_, Path_]]:
    """Apply the inheritance rule; return the merged mapping and where each path came from."""
    merged: dict[str, Any] = {}
    origins: dict[Path_, Path_] = {}

    def record(rel: Path_, where: Path_, value: Any) -> None:
        origins[rel] = where
        if isinstance(value, dict):
            for k, v in value.items():
                record((*rel, k), (*where, k), v)
        elif isinstance(value, list):
            for j, v in enumerate(value):
                record((*rel, j), (*where, j), v)

    def merge_into(target: dict[str, Any], rel: Path_, layer: dict[str, Any], where: Path_) -> None:
        for key, value in layer.items():
            r, w = (*rel, key), (*where, key)
            if value is None:
                target.pop(key, None)
                for stale in [o for o in origins if o[: len(r)] == r]:
                    del origins[stale]
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                origins[r] = w
                merge_into(target[key], r, value, w)
            else:
                for stale in [o for o in origins if o[: len(r)] == r]:
                    del origins[stale]
                target[key] = _without_nulls(value)
                record(r, w, target[key])

    for where, layer in layers:
        if isinstance(layer, dict):
            merge_into(merged, (), layer, where)
    return merged, origins


def _inherit_accepted_conflicts(cells: list[Cell], bases: tuple[Base, ...]) -> tuple[Cell, ...]:
    """A cell built on another cell's image stands on that stack, so it accepts what that cell
    accepted (its own entries win). Resolved here, once, so checks see the whole list."""
    by_id = {c.id: c for c in cells}
    resolved = []
    for cell in cells:
        chain = lineage(cell, by_id)
        if len(chain) > 1:
            merged: dict[str, str] = {}
            for layer in reversed(chain):  # the root first: each cell's entries win over those below
                merged.update(layer.accepted_conflicts)
            cell = dataclasses.replace(cell, accepted_conflicts=tuple(sorted(merged.items())))
        resolved.append(cell)
    return tuple(resolved)


def _without_nulls(value: Any) -> Any:
    """A copy of `value` where `null` mapping entries are dropped: null always means "remove"."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)


def _finite_in(value: Any, low: float, high: float, *, zero_ok: bool = False) -> bool:
    """A real number (not a boolean, NaN or infinity) in (low, high], or [low, high] with zero_ok."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if not math.isfinite(value):
        return False
    return (low <= value if zero_ok else low < value) and value <= high


def _shown(value: Any) -> str:
    """A value for a message, short (a 50 MB scalar must not become a 50 MB message)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    matches = difflib.get_close_matches(word, list(choices), n=1)
    return f", did you mean {matches[0]!r}?" if matches else ""


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), type(value).__name__)

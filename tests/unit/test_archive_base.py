"""The archive base (pipeline/build/archive.py, bases.NAME.archive in matrix.yaml): parsing and its
located errors, the plan (tag pinned by the sha256, /tmp for a rootfs), and the checks before docker."""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.build.archive import archive_path, ensure_archive_base
from pipeline.build.plan import plan_cell
from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import ArchiveBase, Matrix
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import SiteSettings, load_site
from tests.unit.conftest import Invalid
from tests.unit.fake_docker import RecordingDocker

SHA = "ab" * 32


def _matrix(sha: str = SHA, fmt: str = "rootfs", extra: str = "") -> str:
    return f"""\
schema_version: 1
indexes:
  pypi: {{url: "https://pypi.org/simple"}}
bases:
  hostbase:
    archive: hostbase.tar
    sha256: "{sha}"
    format: {fmt}
    python: /opt/torch/.venv/bin/python
{extra}cells:
  - id: a
    base: hostbase
    platform: linux/amd64
    arch: none
"""


def test_an_archive_base_parses_and_pins_the_content_tag(write_matrix: Callable[[str], Path], images_dir: Path) -> None:
    text = _matrix(extra="    env: {PATH: /opt/torch/.venv/bin:/usr/bin:/bin}\n")
    matrix = load_matrix(write_matrix(text), images_dir=images_dir)
    base = matrix.cell("a").base
    assert isinstance(base, ArchiveBase) and base.format == "rootfs" and base.tag.endswith(":" + SHA[:32])
    assert base.env == (("PATH", "/opt/torch/.venv/bin:/usr/bin:/bin"),) and base.line == 7
    plan = plan_cell(matrix, matrix.cell("a"), SiteSettings(), images_dir)
    assert plan.dockerfile.startswith("# Rendered") and f"FROM {base.tag}\n" in plan.dockerfile
    assert "RUN mkdir -p /tmp && chmod 1777 /tmp" in plan.dockerfile  # an imported tree has no /tmp
    other = load_matrix(write_matrix(text.replace(SHA, "cd" * 32), "other.yaml"), images_dir=images_dir)
    assert plan_cell(other, other.cell("a"), SiteSettings(), images_dir).tag != plan.tag
    loaded = load_matrix(write_matrix(_matrix(fmt="docker-archive"), "load.yaml"), images_dir=images_dir)
    assert "mkdir -p /tmp" not in plan_cell(loaded, loaded.cell("a"), SiteSettings(), images_dir).dockerfile


def test_archive_base_errors_name_file_line_field(invalid: Callable[..., Invalid]) -> None:
    r = invalid(_matrix(sha="sha256:" + SHA, fmt="tarball", extra="    env: {A: b}\n    digest: x\n"))
    assert r.problems == [
        f"{r.at('digest: x')}: bases.hostbase.digest: unknown key",
        f"{r.at('sha256:')}: bases.hostbase.sha256: 'sha256:{SHA}' is not a valid sha256 (64 lowercase hex digits)",
        f"{r.at('format:')}: bases.hostbase.format: unknown archive format 'tarball'",
        f"{r.at('env:')}: bases.hostbase.env: only a `format: rootfs` base takes env "
        "(an image archive has its own config)",
    ]


class _Daemon(RecordingDocker):
    """Records the argv; `docker image inspect` answers as if `present` were the tags here."""

    def __init__(self, present: set[str], load_output: str = "") -> None:
        super().__init__(stdout=load_output)
        self.present = present

    def _docker(self, *args: str, **kw: object):  # type: ignore[no-untyped-def]
        result = super()._docker(*args, **kw)
        if args[:2] == ("image", "inspect"):
            found = args[2] in self.present
            out = '[{"Id": "sha256:1"}]' if found else ""
            return result.__class__(argv=args, returncode=0 if found else 1, stdout=out, stderr="", seconds=0.0)
        return result


def _tar(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "root" / "bin").mkdir(parents=True)
    (tmp_path / "root" / "bin" / "hello").write_text("hi\n")
    path = tmp_path / "hostbase.tar"
    with tarfile.open(path, "w") as tar:
        tar.add(tmp_path / "root" / "bin", arcname="bin")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _base(sha: str, fmt: str = "rootfs", archive: str = "hostbase.tar") -> ArchiveBase:
    env = (("PATH", "/opt/torch/.venv/bin:/usr/bin"),) if fmt == "rootfs" else ()
    return ArchiveBase(name="hostbase", archive=archive, sha256=sha, format=fmt, env=env, line=7)


def test_a_rootfs_is_checked_then_imported_once(tmp_path: Path) -> None:
    path, sha = _tar(tmp_path)
    docker = _Daemon(present=set())
    tag = ensure_archive_base(docker, _base(sha), directory=tmp_path, matrix_file=Path("m.yaml"))
    imports = [c for c in docker.calls if c[:2] == ("image", "import")]
    assert imports == [("image", "import", "--change", "ENV PATH=/opt/torch/.venv/bin:/usr/bin", str(path), tag)]
    again = _Daemon(present={tag})
    ensure_archive_base(again, _base(sha), directory=tmp_path, matrix_file=Path("m.yaml"))
    assert [c[:2] for c in again.calls] == [("image", "inspect")]  # there: neither hashed nor loaded


def test_a_docker_archive_is_loaded_and_tagged(tmp_path: Path) -> None:
    path, sha = _tar(tmp_path)
    docker = _Daemon(present=set(), load_output="Loaded image: hostbase:1\n")
    tag = ensure_archive_base(docker, _base(sha, "docker-archive"), directory=tmp_path, matrix_file=Path("m"))
    assert ("image", "load", "--input", str(path)) in docker.calls and ("tag", "hostbase:1", tag) in docker.calls
    two = _Daemon(present=set(), load_output="Loaded image: a:1\nLoaded image: b:1\n")
    with pytest.raises(InputError, match="holds 2 images"):
        ensure_archive_base(two, _base(sha, "oci"), directory=tmp_path, matrix_file=Path("m"))


def test_a_wrong_sha256_is_exit_2_before_docker_sees_the_file(tmp_path: Path) -> None:
    _tar(tmp_path)
    docker = _Daemon(present=set())
    with pytest.raises(InputError, match=r"^m.yaml:7: bases.hostbase.sha256: .* has sha256 [0-9a-f]{64}, not a"):
        ensure_archive_base(docker, _base("a" * 64), directory=tmp_path, matrix_file=Path("m.yaml"))
    assert [c[:2] for c in docker.calls] == [("image", "inspect")]


def test_a_missing_archive_is_exit_3_saying_where(tmp_path: Path) -> None:
    docker = _Daemon(present=set())
    with pytest.raises(InfraError, match=f"{tmp_path}/hostbase.tar not found .*STACKPROOF_BASE_ARCHIVES={tmp_path}"):
        ensure_archive_base(docker, _base(SHA), directory=tmp_path, matrix_file=Path("m.yaml"))
    assert archive_path(_base(SHA, archive="/abs/x.tar"), tmp_path) == Path("/abs/x.tar")


def test_the_site_directory_setting(write_matrix: Callable[[str], Path], images_dir: Path, tmp_path: Path) -> None:
    matrix = load_matrix(write_matrix(_matrix()), images_dir=images_dir)
    env = {"STACKPROOF_MIRRORS": "none", "STACKPROOF_BASE_ARCHIVES": str(tmp_path)}
    assert load_site(matrix, env).base_archives == tmp_path
    assert load_site(matrix, {"STACKPROOF_MIRRORS": "none"}).base_archives is None


def test_preflight_facts_of_an_archive_base(real_matrix: Matrix) -> None:
    from pipeline.host.facts import _image_facts

    cell = real_matrix.cell("gpu-docker-vllm-0.26.0-tiny")
    require, require_source, platforms, platforms_source = _image_facts(real_matrix, cell, None)
    assert (require, platforms) == ("", None)
    assert "local archive" in require_source and platforms_source.startswith("unknown: base gpu-host-tree")


def test_a_cell_over_an_archive_base_names_the_stack_it_is_given(real_matrix) -> None:
    """The GPU host's tree holds vLLM already: `given` names it (accepted over an archive base, refused
    over any other docker base: tests/unit/matrix_texts.py), so `matrix audit` reads its wheels."""
    cell = real_matrix.cell("gpu-docker-vllm-0.26.0-tiny")
    assert {g.name: g.version for g in cell.given} == {
        "vllm": "0.26.0",
        "flashinfer-python": "0.6.14",
        "uvicorn": "0.54.0",
        "torch": "2.11.0",
    }

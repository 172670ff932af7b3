"""The site configuration the CLI and the nox sessions share: the local wheel directory found the
way pip finds it, STACKPROOF_MIRRORS winning, and an unreachable index named before a build."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import InfraError
from pipeline.matrix.model import Matrix
from pipeline.matrix.read import load_matrix
from pipeline.matrix.site import FIND_LINKS_INDEX, Mirror, SiteSettings, load_site
from tests.conftest import unit_tier_first

QUIET = {"STACKPROOF_CA_BUNDLE": "none", "STACKPROOF_DEBIAN_MIRROR": "http://deb.example/debian"}
NO_PIP_CONFIG = {**QUIET, "PIP_CONFIG_FILE": os.devnull}  # as in pip: no configuration file at all


def test_the_local_wheel_directory_in_pip_find_links_serves_the_cpu_torch_index(
    real_matrix: Matrix, tmp_path: Path
) -> None:
    site = load_site(real_matrix, {**NO_PIP_CONFIG, "PIP_FIND_LINKS": f"https://x.example/links {tmp_path}"})
    assert site.mirror(FIND_LINKS_INDEX) == Mirror(index=FIND_LINKS_INDEX, location=str(tmp_path))
    assert [m.index for m in site.mirrors] == [FIND_LINKS_INDEX], "only that index: the others are reachable"
    assert site.notes == (f"index pytorch-cpu from {tmp_path} (PIP_FIND_LINKS); STACKPROOF_MIRRORS overrides it",)


def test_pip_s_configuration_file_is_read_when_the_variable_is_unset(real_matrix: Matrix, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = file://{wheels}\ncert = /nonexistent\n")
    site = load_site(real_matrix, {**QUIET, "PIP_CONFIG_FILE": str(config)})
    assert site.mirror(FIND_LINKS_INDEX) == Mirror(index=FIND_LINKS_INDEX, location=str(wheels))
    assert str(config) in site.notes[0]


@pytest.mark.parametrize(
    "env",
    [
        {"PIP_FIND_LINKS": "/nonexistent/wheels"},  # a directory that is not there
        {"PIP_FIND_LINKS": "https://x.example/links"},  # a URL is pip's business, not a wheel directory
        {},  # nothing configured at all
    ],
)
def test_no_local_wheel_directory_means_no_mirror(real_matrix: Matrix, env: dict[str, str]) -> None:
    site = load_site(real_matrix, {**NO_PIP_CONFIG, **env})
    assert site.mirrors == () and site.notes == ()


def test_an_explicit_stackproof_mirrors_wins_and_none_turns_mirrors_off(real_matrix: Matrix, tmp_path: Path) -> None:
    env = {**NO_PIP_CONFIG, "PIP_FIND_LINKS": str(tmp_path)}
    explicit = load_site(real_matrix, {**env, "STACKPROOF_MIRRORS": "pypi=https://mirror.example/simple"})
    assert [m.index for m in explicit.mirrors] == ["pypi"] and explicit.notes == ()
    assert load_site(real_matrix, {**env, "STACKPROOF_MIRRORS": "none"}).mirrors == ()


def test_a_matrix_without_the_cpu_torch_index_gets_no_mirror(tmp_path: Path, images_dir: Path) -> None:
    matrix_file = tmp_path / "matrix.yaml"
    matrix_file.write_text(
        'schema_version: 1\nindexes:\n  pypi: {url: "https://pypi.org/simple"}\nbases:\n  img:\n'
        '    image: "example/img:1.0"\n    digest: "sha256:' + "a" * 64 + '"\ncells: []\n'
    )
    try:
        matrix = load_matrix(matrix_file, images_dir=images_dir)
    except Exception as exc:  # an empty cell list may be refused; the site rule is what is tested
        pytest.skip(f"minimal matrix not accepted: {exc}")
    assert load_site(matrix, {**NO_PIP_CONFIG, "PIP_FIND_LINKS": str(tmp_path)}).mirrors == ()


# -- reachability ------------------------------------------------------------------------------------


def test_an_unreachable_index_without_a_mirror_is_exit_3_naming_it_and_the_variable(real_matrix: Matrix) -> None:
    asked: list[str] = []

    def reach(url: str) -> str | None:
        asked.append(url)
        return None if "pypi" in url else "cannot connect (Name or service not known)"

    with pytest.raises(InfraError) as info:
        SiteSettings().check_reachable(real_matrix, ["pypi", "pytorch-cpu"], reach=reach)
    message = str(info.value)
    assert info.value.exit_code == 3
    assert "index pytorch-cpu (https://download.pytorch.org/whl/cpu) is unreachable" in message
    assert "STACKPROOF_MIRRORS" in message and "index pypi" not in message
    assert asked == ["https://pypi.org/simple", "https://download.pytorch.org/whl/cpu"]


def test_a_mirrored_index_is_not_asked_and_reachable_ones_pass(real_matrix: Matrix, tmp_path: Path) -> None:
    site = SiteSettings(mirrors=(Mirror(index="pytorch-cpu", location=str(tmp_path)),))
    asked: list[str] = []
    site.check_reachable(real_matrix, ["pypi", "pytorch-cpu"], reach=lambda url: asked.append(url))
    assert asked == ["https://pypi.org/simple"]


@pytest.fixture
def answering_url() -> Iterator[str]:
    """A real HTTP server on loopback that answers every request with 404."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_the_real_probe_counts_any_answer_as_reachable_and_a_closed_port_as_not(answering_url: str) -> None:
    assert SiteSettings()._reach(answering_url) is None, "a 404 still proves the host answers"
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    why = SiteSettings()._reach(f"http://127.0.0.1:{closed}/simple")
    assert why is not None and why.startswith("cannot connect")


# -- the test tiers' order -----------------------------------------------------------------------------


def test_pytest_runs_the_unit_tier_before_the_integration_tier() -> None:
    tests = Path(__file__).resolve().parents[1]
    items = [
        SimpleNamespace(path=tests / "integration" / "test_build.py", name="i1"),
        SimpleNamespace(path=tests / "unit" / "test_plan.py", name="u1"),
        SimpleNamespace(path=tests / "integration" / "test_run.py", name="i2"),
        SimpleNamespace(path=tests / "unit" / "test_site.py", name="u2"),
    ]
    assert [i.name for i in unit_tier_first(items)] == ["u1", "u2", "i1", "i2"]  # type: ignore[arg-type]


# -- a base a runner user cannot bootstrap ---------------------------------------------------------------


@pytest.mark.parametrize(("euid", "message"), [(1001, "needs root"), (0, "no Debian mirror known")])
def test_bootstrapping_a_base_as_a_non_root_user_is_exit_3_saying_run_it_once_as_root(
    real_matrix: Matrix, monkeypatch: pytest.MonkeyPatch, euid: int, message: str
) -> None:
    from pipeline.build import bootstrap
    from pipeline.matrix.model import BootstrapBase
    from tests.unit.fake_docker import RecordingDocker

    class NoImages(RecordingDocker):
        def image(self, ref: str) -> None:
            return None

    monkeypatch.setattr(bootstrap.os, "geteuid", lambda: euid)
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: f"/usr/sbin/{name}")
    base = next(b for b in real_matrix.bases if isinstance(b, BootstrapBase))
    with pytest.raises(InfraError, match=message) as info:  # root goes on, to the next missing thing
        bootstrap.ensure_base(NoImages(), base, SiteSettings(debian_mirror=None), Path("images"))
    assert info.value.exit_code == 3

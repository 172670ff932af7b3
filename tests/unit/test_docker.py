"""The edges that need no docker: CLI detection (with a fake runner), lock parsing, site settings."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.build.lock import parse_compiled
from pipeline.cmd import CommandResult
from pipeline.docker.client import DockerCli, detect_cli
from pipeline.errors import InfraError, InputError
from pipeline.matrix.model import Matrix
from pipeline.matrix.site import Mirror, SiteSettings, load_site

# -- docker CLI detection ---------------------------------------------------------------------------

BUILD_HELP_WITH_SECRET = "Usage:  docker build [OPTIONS] PATH\n  --secret stringArray   Secret file\n"
BUILD_HELP_LEGACY = "Usage:  docker build [OPTIONS] PATH\n  --tag list   Name and optionally a tag\n"


@dataclass
class FakeDocker:
    version: str  # what `docker version --format {{.Client.Version}}` prints ("" for nothing)
    buildx: bool = False
    build_help: str = BUILD_HELP_WITH_SECRET


@dataclass
class FakeRunner:
    """Answers the three questions detect_cli asks, per CLI path; records every call."""

    clis: dict[str, FakeDocker]
    calls: list[tuple[tuple[str, ...], dict[str, str]]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], env: dict[str, str]) -> CommandResult:
        self.calls.append((tuple(argv), dict(env)))
        cli = self.clis[argv[0]]
        args = tuple(argv[1:])
        if args[0] == "version":
            return _result(argv, 0, cli.version + "\n" if cli.version else "")
        if args == ("buildx", "version"):
            if cli.buildx:
                return _result(argv, 0, "github.com/docker/buildx v0.17.1\n")
            return _result(argv, 1, "", "docker: 'buildx' is not a docker command.\n")
        if args == ("build", "--help"):
            return _result(argv, 0, cli.build_help)
        raise AssertionError(f"unexpected command {argv}")


def _result(argv: Sequence[str], returncode: int, stdout: str, stderr: str = "") -> CommandResult:
    return CommandResult(argv=tuple(argv), returncode=returncode, stdout=stdout, stderr=stderr, seconds=0.01)


def test_buildx_anywhere_beats_an_earlier_classic_cli() -> None:
    runner = FakeRunner(
        {
            "/usr/local/bin/docker": FakeDocker("20.10.24"),
            "/usr/bin/docker": FakeDocker("27.3.1", buildx=True),
        }
    )
    cli = detect_cli(["/usr/local/bin/docker", "/usr/bin/docker"], runner=runner)
    assert cli == DockerCli(path="/usr/bin/docker", mode="buildx", version="27.3.1")
    assert cli.build_argv() == ["/usr/bin/docker", "buildx", "build", "--load"]
    assert cli.build_env == {}


def test_first_buildx_cli_wins() -> None:
    runner = FakeRunner(
        {
            "/a/docker": FakeDocker("28.0.1", buildx=True),
            "/b/docker": FakeDocker("27.0.0", buildx=True),
        }
    )
    assert detect_cli(["/a/docker", "/b/docker"], runner=runner).path == "/a/docker"
    assert all(argv[0] == "/a/docker" for argv, _ in runner.calls)  # stops at the first that can


def test_classic_docker_20_10_uses_builtin_buildkit() -> None:
    runner = FakeRunner({"/usr/bin/docker": FakeDocker("20.10.24+dfsg1")})
    cli = detect_cli(["/usr/bin/docker"], runner=runner)
    assert cli == DockerCli(path="/usr/bin/docker", mode="classic-buildkit", version="20.10.24+dfsg1")
    assert cli.build_env == {"DOCKER_BUILDKIT": "1"}
    assert cli.build_argv() == ["/usr/bin/docker", "build"]
    # `--secret` only shows in the help when BuildKit is on, so the probe must turn it on.
    assert (("/usr/bin/docker", "build", "--help"), {"DOCKER_BUILDKIT": "1"}) in runner.calls


def test_newer_static_cli_without_buildx_is_skipped_for_a_classic_one() -> None:
    runner = FakeRunner(
        {
            "/usr/local/bin/docker": FakeDocker("28.1.1"),
            "/usr/bin/docker": FakeDocker("20.10.24"),
        }
    )
    cli = detect_cli(["/usr/local/bin/docker", "/usr/bin/docker"], runner=runner)
    assert (cli.path, cli.mode) == ("/usr/bin/docker", "classic-buildkit")


def test_docker_28_without_buildx_is_rejected() -> None:
    runner = FakeRunner({"/usr/local/bin/docker": FakeDocker("28.1.1")})
    with pytest.raises(InfraError) as info:
        detect_cli(["/usr/local/bin/docker"], runner=runner)
    assert "no BuildKit-capable docker CLI among /usr/local/bin/docker (28.1.1)" in str(info.value)
    assert info.value.exit_code == 3
    assert not any(argv[1:] == ("build", "--help") for argv, _ in runner.calls)  # not even probed


def test_none_capable_lists_everything_found() -> None:
    runner = FakeRunner(
        {
            "/opt/docker": FakeDocker("28.1.1"),
            "/usr/bin/docker": FakeDocker("19.03.13", build_help=BUILD_HELP_LEGACY),
            "/broken/docker": FakeDocker(""),
        }
    )
    with pytest.raises(InfraError) as info:
        detect_cli(["/opt/docker", "/usr/bin/docker", "/broken/docker"], runner=runner)
    message = str(info.value)
    assert message.startswith(
        "no BuildKit-capable docker CLI among "
        "/opt/docker (28.1.1), /usr/bin/docker (19.03.13), /broken/docker (unknown): "
    )
    assert "install docker buildx" in message
    assert info.value.exit_code == 3


def test_no_candidates_at_all() -> None:
    with pytest.raises(InfraError, match="no docker CLI on PATH") as info:
        detect_cli([], runner=FakeRunner({}))
    assert info.value.exit_code == 3


# -- uv / pip-compile output ------------------------------------------------------------------------

H = {name: "sha256:" + hashlib.sha256(name.encode()).hexdigest() for name in ("a1", "a2", "b1", "c1", "t1")}

COMPILED = f"""\
# This file was autogenerated by uv via the following command:
#    uv pip compile --generate-hashes requirements.in
Zeta_Pkg==2.0.1 \\
    --hash={H["b1"]}
    # via -r requirements.in
aiohttp==3.14.5 \\
    --hash={H["a2"]} \\
    --hash={H["a1"]}
    # via
    #   vllm
    #   fsspec
torch==2.13.0+cpu \\
    --hash={H["t1"]}
typing-extensions==4.15.0 ; python_full_version < '3.13' \\
    --hash={H["c1"]}
"""


def test_parse_compiled_reads_pins_and_hashes() -> None:
    assert parse_compiled(COMPILED) == [
        ("aiohttp", "3.14.5", tuple(sorted((H["a2"], H["a1"])))),  # hashes sorted
        ("torch", "2.13.0+cpu", (H["t1"],)),  # local version kept
        ("typing-extensions", "4.15.0", (H["c1"],)),  # marker dropped
        ("zeta-pkg", "2.0.1", (H["b1"],)),  # canonical name, sorted by name
    ]


def test_parse_compiled_ignores_comments_and_empty_output() -> None:
    assert parse_compiled("") == []
    assert parse_compiled("# nothing to install\n") == []
    assert parse_compiled("six==1.16.0\n") == [("six", "1.16.0", ())]


# -- site settings ----------------------------------------------------------------------------------

BASE_ENV = {"STACKPROOF_CA_BUNDLE": "none", "STACKPROOF_DEBIAN_MIRROR": "http://deb.example/debian"}


def test_no_mirrors_when_neither_stackproof_nor_pip_configures_one(real_matrix: Matrix) -> None:
    site = load_site(real_matrix, {**BASE_ENV, "PIP_CONFIG_FILE": os.devnull})  # pip's "no config files"
    assert site == SiteSettings(mirrors=(), ca_bundle=None, debian_mirror="http://deb.example/debian")
    assert site.index_location(real_matrix, "flashinfer") == Mirror(
        index="flashinfer", location="https://flashinfer.ai/whl"
    )
    assert site.secrets() == ()


def test_mirrors_parse_urls_and_local_directories(real_matrix: Matrix, tmp_path: Path) -> None:
    mirrors = f" pypi=https://u:s3cret@mirror.example/simple , flashinfer={tmp_path},"
    env = {**BASE_ENV, "STACKPROOF_MIRRORS": mirrors}
    site = load_site(real_matrix, env)
    pypi, flashinfer = site.mirrors
    assert pypi == Mirror(index="pypi", location="https://u:s3cret@mirror.example/simple")
    assert not pypi.is_local
    assert flashinfer.is_local and flashinfer.directory == tmp_path
    assert site.mirror("flashinfer-cu130") is None
    assert site.index_location(real_matrix, "pypi") is pypi
    assert site.secrets() == ("https://u:s3cret@mirror.example/simple",)


def test_file_url_mirror_is_a_local_directory(real_matrix: Matrix, tmp_path: Path) -> None:
    site = load_site(real_matrix, {**BASE_ENV, "STACKPROOF_MIRRORS": f"pypi=file://{tmp_path}"})
    assert site.mirrors[0].is_local
    assert site.mirrors[0].directory == tmp_path


def test_mirror_for_unknown_index_lists_the_known(real_matrix: Matrix) -> None:
    with pytest.raises(InputError) as info:
        load_site(real_matrix, {**BASE_ENV, "STACKPROOF_MIRRORS": "pypy=https://mirror.example/simple"})
    assert str(info.value) == (
        f"STACKPROOF_MIRRORS: 'pypy' is not an index in {real_matrix.file} "
        "(known: pypi, pytorch-cpu, flashinfer, flashinfer-cu130)"
    )
    assert info.value.exit_code == 2


def test_mirror_to_missing_directory(real_matrix: Matrix, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InputError) as info:
        load_site(real_matrix, {**BASE_ENV, "STACKPROOF_MIRRORS": f"pypi={missing}"})
    assert str(info.value) == f"STACKPROOF_MIRRORS: pypi={missing}: no such directory"


@pytest.mark.parametrize("entry", ["pypi", "pypi=", "https://mirror.example/simple"])
def test_mirror_entry_without_index_and_location(real_matrix: Matrix, entry: str) -> None:
    with pytest.raises(InputError, match="is not INDEX=LOCATION"):
        load_site(real_matrix, {**BASE_ENV, "STACKPROOF_MIRRORS": entry})


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("https://user:password@mirror.example/simple", "https://***@mirror.example/simple"),
        ("https://token@mirror.example/simple", "https://***@mirror.example/simple"),
        ("https://mirror.example/simple", "https://mirror.example/simple"),
        ("/srv/wheels", "/srv/wheels"),
    ],
)
def test_mirror_redacted_hides_credentials(location: str, shown: str) -> None:
    mirror = Mirror(index="pypi", location=location)
    assert mirror.redacted == shown
    assert "password" not in mirror.redacted


def test_ca_bundle_from_environment(real_matrix: Matrix, tmp_path: Path) -> None:
    bundle = tmp_path / "corp-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert load_site(real_matrix, {**BASE_ENV, "STACKPROOF_CA_BUNDLE": str(bundle)}).ca_bundle == bundle
    assert load_site(real_matrix, {**BASE_ENV, "STACKPROOF_CA_BUNDLE": "none"}).ca_bundle is None
    assert load_site(real_matrix, {**BASE_ENV, "STACKPROOF_CA_BUNDLE": "NONE"}).ca_bundle is None


def test_ca_bundle_missing_file(real_matrix: Matrix, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(InputError) as info:
        load_site(real_matrix, {**BASE_ENV, "STACKPROOF_CA_BUNDLE": str(missing)})
    assert str(info.value) == f"STACKPROOF_CA_BUNDLE: {missing}: no such file"


def test_ca_bundle_falls_back_to_pip_cert(real_matrix: Matrix, tmp_path: Path) -> None:
    bundle = tmp_path / "pip-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {"PIP_CERT": str(bundle), "STACKPROOF_DEBIAN_MIRROR": "http://deb.example/debian"}
    assert load_site(real_matrix, env).ca_bundle == bundle


def test_ca_bundle_from_pip_config_file(real_matrix: Matrix, tmp_path: Path) -> None:
    bundle = tmp_path / "conf-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\ncert = {bundle}\n")
    env = {"PIP_CONFIG_FILE": str(config), "STACKPROOF_DEBIAN_MIRROR": "http://deb.example/debian"}
    assert load_site(real_matrix, env).ca_bundle == bundle

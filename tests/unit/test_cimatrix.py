"""`stackproof ci-matrix`: the include list of the real matrix, and `--changed-since` against real git
repositories made in tmp_path from copies of matrix.yaml, images/ and locks/."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.matrix.cimatrix import ENTRY_KEYS, changed_cells, include_entries
from pipeline.matrix.model import Matrix
from stackproof.cli import main
from tests.unit.conftest import line_of

REPO = Path(__file__).resolve().parents[2]

CPU = "cpu-tiny"
MATCHED = "fi-0.6.13-matched"
MISMATCH = "fi-mismatch"
FI_07 = "fi-0.7.4-cubin-0.6.13"
RELEASE = "sm120-vllm-0.28.0-release"
FIXED = "sm120-vllm-0.28.0-fi-0.6.18.post1-cu130"
SPARK = "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130"
ON_CPU_TINY = {CPU, MATCHED, MISMATCH, FI_07}  # the fi-* cells are built on cpu-tiny's image
ON_VLLM_IMAGE = {RELEASE, FIXED, SPARK}
# The v0.33.0 cells extend the 0.28.0 ones (sm120 the release cell, sm121 SPARK), on their own base;
# the v0.34.0 cells extend the 0.33.0 ones.
ON_VLLM_033 = {"sm120-vllm-0.33.0-release", "sm121-vllm-0.33.0-release"}
ON_VLLM_033 |= {"sm120-vllm-0.34.0-release", "sm121-vllm-0.34.0-release"}
SPARK_033 = "sm121-vllm-0.33.0-release"
SPARK_034 = "sm121-vllm-0.34.0-release"
SGLANG_CPU = "sglang-cpu-tiny"  # bootstrapped like cpu-tiny, with the tiny-model recipe
ON_SGLANG_IMAGES = {
    "sm120-sglang-0.5.18-qwen3.8-nvfp4",
    "sm120-sglang-0.5.19-qwen3.8-nvfp4",
    "sm120-sglang-0.5.23-qwen3.8-nvfp4",
}
CPU_HOST = "cpu-tiny-host"  # cpu-tiny's lock and recipes on the host runtime: no Dockerfile
H200 = "h200-vllm-0.26.0-tiny"  # the host's own environment: no lock, no recipe, no Dockerfile
CPU_032 = "cpu-tiny-vllm-0.32"  # extends cpu-tiny (its packages, recipes), with a lock of its own
GPU_DOCKER = "gpu-docker-vllm-0.26.0-tiny"  # the GPU host's tree as an archive base, the tiny-model recipe
# rendered from the templates
IN_DOCKER = ON_CPU_TINY | ON_VLLM_IMAGE | ON_VLLM_033 | {SGLANG_CPU, CPU_032, GPU_DOCKER} | ON_SGLANG_IMAGES
ALL = IN_DOCKER | {CPU_HOST, H200}
ON_CPU_TINY_LOCK = ON_CPU_TINY | {CPU_HOST}
ON_TINY_MODEL = ON_CPU_TINY | {SGLANG_CPU, CPU_HOST, CPU_032, GPU_DOCKER}  # the tiny-model recipe's cells


@pytest.fixture(autouse=True)
def _quiet_git_and_signals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No user or system git configuration (hooks, signing, diff drivers); main()'s SIGTERM handler
    must not outlive a test."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("STACKPROOF_MATRIX", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


# -- a git repository holding a copy of the project's matrix ---------------------------------------


@dataclass(frozen=True)
class GitRepo:
    path: Path

    @property
    def matrix(self) -> Path:
        return self.path / "matrix.yaml"

    def git(self, *argv: str) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid",
        }
        done = subprocess.run(["git", *argv], cwd=self.path, env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def commit(self, message: str = "change") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def edit_matrix(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Change matrix.yaml through its data (a YAML round trip: comments and layout change too)."""
        data = yaml.safe_load(self.matrix.read_text())
        change(data)
        self.matrix.write_text(yaml.safe_dump(data, sort_keys=False, width=200))

    def append(self, rel: str, text: str) -> None:
        with (self.path / rel).open("a") as f:
            f.write(text)


def make_repo(path: Path, *, with_matrix: bool = True) -> GitRepo:
    """matrix.yaml, images/ and locks/ of this project, committed as the first commit."""
    path.mkdir(parents=True)
    ignore = shutil.ignore_patterns(".ruff_cache", "__pycache__", ".mypy_cache")
    shutil.copytree(REPO / "images", path / "images", ignore=ignore)
    shutil.copytree(REPO / "locks", path / "locks", ignore=ignore)
    (path / "README.md").write_text("a copy of stackproof's matrix\n")
    repo = GitRepo(path)
    repo.git("init", "-q")
    if with_matrix:
        shutil.copy(REPO / "matrix.yaml", repo.matrix)
    repo.commit("first")
    return repo


@pytest.fixture
def repo(tmp_path: Path) -> GitRepo:
    return make_repo(tmp_path / "repo")


def cell(data: dict[str, Any], cell_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in data["cells"] if c["id"] == cell_id)
    return found


def ci_matrix(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """Run `stackproof ci-matrix ARGV --json`; (exit code, parsed stdout or None, stderr)."""
    code = main(["ci-matrix", "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def selected(capsys: pytest.CaptureFixture[str], repo: GitRepo, ref: str) -> set[str]:
    code, doc, err = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", ref)
    assert code == 0, err
    return {e["cell"] for e in doc["include"]}


# -- the include list -------------------------------------------------------------------------------


def test_include_list_has_every_cell_of_the_real_matrix_with_its_runner_labels(real_matrix: Matrix) -> None:
    entries = include_entries(real_matrix)
    assert [e.cell for e in entries] == [c.id for c in real_matrix.cells]
    by_id = {e.cell: e.to_json() for e in entries}
    assert by_id[CPU] == {
        "cell": CPU,
        "arch": "none",
        "platform": "linux/amd64",
        "runs-on": ["self-hosted", "linux", "x64", "docker"],
        "build-runs-on": ["self-hosted", "linux", "x64", "docker"],
        "gpu": False,
        "expect": None,
    }
    assert by_id[SPARK] == {
        "cell": SPARK,
        "arch": "sm121",
        "platform": "linux/arm64",
        "runs-on": ["self-hosted", "linux", "arm64", "gpu", "sm121"],
        "build-runs-on": ["self-hosted", "linux", "arm64", "docker"],  # built natively, on a CPU runner
        "gpu": True,
        "expect": None,
    }
    assert by_id[RELEASE]["expect"] == "autotune"
    assert by_id[MISMATCH]["expect"] == "imports"
    assert by_id[FI_07]["expect"] == "imports"
    for c in real_matrix.cells:
        assert by_id[c.id]["runs-on"] == list(c.runner)
        assert by_id[c.id]["gpu"] is (c.arch != "none")


def test_json_is_one_include_list_with_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = ci_matrix(capsys, "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0
    assert list(doc) == ["include"]  # any other top-level key would become a matrix axis
    assert len(doc["include"]) == len(yaml.safe_load((REPO / "matrix.yaml").read_text())["cells"])
    for entry in doc["include"]:
        assert tuple(entry) == ENTRY_KEYS
        assert isinstance(entry["cell"], str) and isinstance(entry["gpu"], bool)
        assert entry["runs-on"] and all(isinstance(label, str) for label in entry["runs-on"])
        assert entry["expect"] is None or isinstance(entry["expect"], str)


def test_table_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ci-matrix", "--matrix", str(REPO / "matrix.yaml"), CPU, SPARK]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["cell", "arch", "platform", "runs-on", "expect"]
    assert lines[1].split() == [CPU, "none", "linux/amd64", "self-hosted,linux,x64,docker", "-"]
    assert lines[2].split() == [SPARK, "sm121", "linux/arm64", "self-hosted,linux,arm64,gpu,sm121", "-"]
    assert lines[-1] == f"2 of {len(yaml.safe_load((REPO / 'matrix.yaml').read_text())['cells'])} cells selected"


def test_named_cells_only_and_an_unknown_one_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = ci_matrix(capsys, "--matrix", str(REPO / "matrix.yaml"), SPARK, CPU)
    assert code == 0
    assert [e["cell"] for e in doc["include"]] == [CPU, SPARK]  # matrix order
    code, doc, err = ci_matrix(capsys, "--matrix", str(REPO / "matrix.yaml"), "cpu-tinny")
    assert code == 2 and doc["error"]["exit_code"] == 2  # --json: an error document, not a matrix
    assert "no cell 'cpu-tinny', did you mean 'cpu-tiny'?" in err


def test_a_cell_without_runner_labels_is_bad_input(
    capsys: pytest.CaptureFixture[str], write_matrix: Callable[[str], Path], header: str
) -> None:
    text = header + "cells:\n  - {id: a, base: img, platform: linux/amd64, arch: none}\n"
    file = write_matrix(text)
    code, doc, err = ci_matrix(capsys, "--matrix", str(file))
    assert code == 2 and doc["error"]["exit_code"] == 2  # --json: an error document, not a matrix
    assert f"{file}:{line_of(text, '- {id: a')}: cells[a]: no runner labels for `runs-on`" in err


# -- --changed-since ---------------------------------------------------------------------------------


def _leaf_env(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: cell(d, SPARK).setdefault("env", {}).update({"NCCL_DEBUG": "INFO"}))


def _parent_env(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: cell(d, RELEASE).setdefault("env", {}).update({"NCCL_DEBUG": "INFO"}))


def _base_cell(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: cell(d, CPU)["system_packages"].append("curl"))


def _registry_base(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: d["bases"]["vllm-openai-0.28.0"].update({"digest": "sha256:" + "b" * 64}))


def _index_url(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: d["indexes"]["flashinfer"].update({"url": "https://mirror.example/flashinfer"}))


def _new_cell(repo: GitRepo) -> None:
    new = {"id": "sm90-new", "extends": FIXED, "arch": "sm90", "runner": ["self-hosted", "linux", "x64", "sm90"]}
    repo.edit_matrix(lambda d: d["cells"].append(new))


def _reformatted(repo: GitRepo) -> None:
    repo.edit_matrix(lambda d: None)  # comments gone, every line moved: the same cells


def _lock(repo: GitRepo) -> None:
    repo.append("locks/cpu-tiny.lock.json", "\n")


def _template(repo: GitRepo) -> None:
    repo.append("images/cell.Dockerfile.j2", "# a comment\n")


def _pip_install(repo: GitRepo) -> None:
    repo.append("images/pip-install.sh", "# a comment\n")


def _recipe_file(repo: GitRepo) -> None:
    repo.append("images/recipes/tiny-model/make_tiny_model.py", "# a comment\n")


def _untracked_recipe_file(repo: GitRepo) -> None:
    (repo.path / "images/recipes/vllm-dist-alias/notes.txt").write_text("new and not added\n")


def _unrelated(repo: GitRepo) -> None:
    repo.append("README.md", "more\n")


def _nothing(repo: GitRepo) -> None:
    pass


CHANGES: dict[str, tuple[Callable[[GitRepo], None], set[str]]] = {
    "nothing": (_nothing, set()),
    "matrix reformatted": (_reformatted, set()),
    "unrelated file": (_unrelated, set()),
    "env of a leaf cell": (_leaf_env, {SPARK, SPARK_033, SPARK_034}),
    "env of a cell others extend": (_parent_env, ON_VLLM_IMAGE | ON_VLLM_033),
    "cell others are built on": (_base_cell, ON_CPU_TINY | {CPU_032}),
    "registry base digest": (_registry_base, ON_VLLM_IMAGE),
    "index url": (_index_url, {FIXED, SPARK}),
    "new cell": (_new_cell, {"sm90-new"}),
    "lock file": (_lock, ON_CPU_TINY_LOCK),
    "dockerfile template": (_template, IN_DOCKER),
    "pip-install.sh": (_pip_install, IN_DOCKER),
    "recipe file": (_recipe_file, ON_TINY_MODEL),
    "untracked recipe file": (_untracked_recipe_file, ON_CPU_TINY_LOCK | {CPU_032}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_since_selects_exactly_the_affected_cells(
    change: str, repo: GitRepo, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, expected = CHANGES[change]
    edit(repo)
    assert selected(capsys, repo, "HEAD") == expected  # the working tree against HEAD


def test_committed_changes_count_the_same(repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    first = repo.git("rev-parse", "HEAD")
    _leaf_env(repo)
    repo.commit()
    _recipe_file(repo)
    repo.commit()
    assert selected(capsys, repo, "HEAD~1") == ON_TINY_MODEL
    assert selected(capsys, repo, first) == ON_TINY_MODEL | {SPARK, SPARK_033, SPARK_034}
    assert selected(capsys, repo, first[:12]) == ON_TINY_MODEL | {
        SPARK,
        SPARK_033,
        SPARK_034,
    }  # any name git resolves to a commit
    assert selected(capsys, repo, "HEAD") == set()


def test_reasons_go_to_stderr_and_the_table(repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    _lock(repo)
    code, doc, err = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", "HEAD")
    assert code == 0
    assert [e["cell"] for e in doc["include"]] == [CPU, CPU_HOST, MATCHED, MISMATCH, FI_07]
    assert f"ci-matrix: {CPU}: locks/cpu-tiny.lock.json changed" in err.splitlines()
    assert f"ci-matrix: {MATCHED}: built on cell {CPU}, which is selected" in err.splitlines()

    assert main(["ci-matrix", "--matrix", str(repo.matrix), "--changed-since", "HEAD"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[-1] == "why"
    assert out[1].startswith(CPU) and out[1].endswith("locks/cpu-tiny.lock.json changed")
    assert out[-1] == "5 of 19 cells selected, changed since HEAD"


def test_changed_since_and_named_cells_intersect(repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    _template(repo)
    code, doc, _ = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", "HEAD", SPARK, CPU)
    assert code == 0
    assert [e["cell"] for e in doc["include"]] == [CPU, SPARK]


def test_no_change_is_an_empty_include_list(repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", "HEAD")
    assert (code, doc) == (0, {"include": []})
    assert main(["ci-matrix", "--matrix", str(repo.matrix), "--changed-since", "HEAD"]) == 0
    assert capsys.readouterr().out == "0 of 19 cells selected, changed since HEAD\n"


def test_no_matrix_at_the_ref_selects_every_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_repo(tmp_path / "repo", with_matrix=False)
    shutil.copy(REPO / "matrix.yaml", repo.matrix)
    code, doc, err = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", "HEAD")
    assert code == 0
    assert {e["cell"] for e in doc["include"]} == ALL
    assert "no matrix.yaml at " in err


def test_an_invalid_matrix_at_the_ref_selects_every_cell(repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    repo.append("matrix.yaml", "bogus_key: 1\n")
    repo.commit()
    shutil.copy(REPO / "matrix.yaml", repo.matrix)
    code, doc, err = ci_matrix(capsys, "--matrix", str(repo.matrix), "--changed-since", "HEAD")
    assert code == 0
    assert {e["cell"] for e in doc["include"]} == ALL
    assert "does not load (1 problem(s)): every cell counts as changed" in err


def test_a_matrix_in_a_subfolder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Paths are relative to the matrix's folder, wherever that sits in the repository."""
    outer = tmp_path / "outer"
    make_repo(outer / "ci")
    repo = GitRepo(outer / "ci")
    (repo.path / ".git").rename(outer / ".git")  # the repository is now outer/, the matrix in ci/
    outer_repo = GitRepo(outer)
    outer_repo.commit("moved into ci/")
    _lock(repo)
    assert selected(capsys, repo, "HEAD") == ON_CPU_TINY_LOCK


@pytest.mark.parametrize("ref", ["no-such-branch", "0" * 40, "--output=/tmp/x"])
def test_a_ref_that_does_not_exist_is_bad_input(ref: str, repo: GitRepo, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = ci_matrix(capsys, "--matrix", str(repo.matrix), f"--changed-since={ref}")
    assert code == 2 and doc["error"]["exit_code"] == 2  # --json: an error document, not a matrix
    assert f"stackproof: error: --changed-since {ref}: " in err


def test_outside_a_git_repository_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    shutil.copy(REPO / "matrix.yaml", folder / "matrix.yaml")
    shutil.copytree(REPO / "images", folder / "images")
    shutil.copytree(REPO / "locks", folder / "locks")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path counts
    code, doc, err = ci_matrix(capsys, "--matrix", str(folder / "matrix.yaml"), "--changed-since", "HEAD")
    assert code == 2 and doc["error"]["exit_code"] == 2  # --json: an error document, not a matrix
    assert f"--changed-since HEAD: {folder} is not in a git repository" in err


def test_changed_cells_without_an_older_matrix_selects_all(real_matrix: Matrix, images_dir: Path) -> None:
    changes = changed_cells(None, real_matrix, [], images_dir)
    assert [c.cell for c in changes] == [c.id for c in real_matrix.cells]
    assert changes[0].reasons == ("no usable matrix at the older commit",)


def test_changed_cells_of_the_same_matrix_is_empty(real_matrix: Matrix, images_dir: Path) -> None:
    assert changed_cells(real_matrix, real_matrix, [REPO / "README.md"], images_dir) == ()


# -- this site's runner labels (STACKPROOF_RUNNER_LABELS) --------------------------------------------


def _labels_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "runners.yaml"
    path.write_text(text)
    return path


def test_a_site_maps_default_labels_onto_arc_scale_sets(real_matrix: Matrix, tmp_path: Path) -> None:
    from pipeline.matrix.runners import load_runner_labels

    path = _labels_file(
        tmp_path,
        "schema_version: 1\n"
        "labels: {self-hosted: [], linux: [], x64: [], arm64: [], gpu: [], docker: [arc-cpu], sm121: [arc-spark]}\n"
        "cells: {cpu-tiny-host: [arc-cpu]}\n"  # its labels are all generic: the site says where it runs
        "build: {linux/amd64: [arc-cpu], linux/arm64: [arc-cpu-arm]}\n",
    )
    by_id = {e.cell: e for e in include_entries(real_matrix, None, load_runner_labels(path, real_matrix))}
    assert by_id[CPU].runs_on == ("arc-cpu",) and by_id[CPU].build_runs_on == ("arc-cpu",)
    assert by_id[SPARK].runs_on == ("arc-spark",) and by_id[SPARK].build_runs_on == ("arc-cpu-arm",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schema_version: 1\nlabel: {}\n", r"runners.yaml:2: label: unknown key, did you mean 'labels'\?"),
        ("schema_version: 2\n", r"runners.yaml:1: schema_version: schema_version must be 1"),
        (
            "schema_version: 1\nlabels:\n  gpu: [ok, 'two words']\n",
            r"runners.yaml:3: labels.gpu\[1\]: 'two words' is not",
        ),
        (
            "schema_version: 1\ncells:\n  cpu-tinny: [x]\n",
            r"runners.yaml:3: cells.cpu-tinny: .* did you mean 'cpu-tiny'",
        ),
        ("schema_version: 1\nbuild: {amd64: [x]}\n", r"runners.yaml:2: build.amd64: a platform such as linux/amd64"),
        ("schema_version: 1\nbuild: []\n", r"runners.yaml:2: build: a non-empty list of labels"),
    ],
)
def test_a_bad_runner_label_file_is_a_located_error(
    real_matrix: Matrix, tmp_path: Path, text: str, message: str
) -> None:
    from pipeline.errors import InputError
    from pipeline.matrix.runners import load_runner_labels

    with pytest.raises(InputError, match=message):
        load_runner_labels(_labels_file(tmp_path, text), real_matrix)


def test_labels_that_map_to_nothing_are_refused(real_matrix: Matrix, tmp_path: Path) -> None:
    from pipeline.errors import InputError
    from pipeline.matrix.runners import load_runner_labels

    labels = load_runner_labels(
        _labels_file(tmp_path, "schema_version: 1\nlabels: {self-hosted: [], linux: [], x64: [], docker: []}\n"),
        real_matrix,
    )
    with pytest.raises(InputError, match="maps to nothing"):
        include_entries(real_matrix, [CPU], labels)


def test_ci_matrix_reads_the_site_label_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _labels_file(tmp_path, "schema_version: 1\ncells: {cpu-tiny: [arc-cpu]}\nbuild: [arc-builder]\n")
    monkeypatch.setenv("STACKPROOF_RUNNER_LABELS", str(path))
    code, doc, err = ci_matrix(capsys, "--matrix", str(REPO / "matrix.yaml"), CPU)
    assert code == 0, err
    assert doc["include"][0]["runs-on"] == ["arc-cpu"] and doc["include"][0]["build-runs-on"] == ["arc-builder"]
    monkeypatch.setenv("STACKPROOF_RUNNER_LABELS", str(tmp_path / "missing.yaml"))
    code, doc, err = ci_matrix(capsys, "--matrix", str(REPO / "matrix.yaml"), CPU)
    assert code == 2 and "missing.yaml: no such file" in err and doc["error"]["exit_code"] == 2

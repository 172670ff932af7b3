"""The fleet site file and the pure placement of cells (pipeline/fleet/site.py, plan.py), and the
Slurm edge's pure parts (sbatch's options, one `scontrol show job -o` line): both ways each."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.fleet.plan import gpu_count, plan_cells
from pipeline.fleet.scheduler import JobRequest
from pipeline.fleet.site import load_fleet_site
from pipeline.fleet.slurm import parse_job_line, sbatch_argv
from pipeline.matrix.read import load_matrix

REPO = Path(__file__).resolve().parents[2]
SITE = """\
schema_version: 1
scheduler: slurm
shared_dir: /shared/fleet
setup: ["source /opt/venv/bin/activate"]
arch:
  none: {}
  sm90: {gres: "gpu:h100", constraint: sm90, partition: gpu}
  sm120: {gres: "gpu:rtx5090"}
"""


@pytest.fixture(scope="module")
def matrix():  # type: ignore[no-untyped-def]
    return load_matrix(REPO / "matrix.yaml", images_dir=REPO / "images")


def site_file(tmp_path: Path, text: str = SITE) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_site_places_cells_by_arch_and_gpu_count(tmp_path: Path, matrix) -> None:  # type: ignore[no-untyped-def]
    site = load_fleet_site(site_file(tmp_path))
    assert site.setup == ("source /opt/venv/bin/activate",) and site.time_limit_min == 60
    cells = [matrix.cell(c) for c in ("cpu-tiny-host", "h200-vllm-0.26.0-tiny", "sm120-vllm-0.28.0-release")]
    cpu, sm90, sm120 = plan_cells(cells, site)
    assert (cpu.gpus, cpu.gres, cpu.describe()) == (0, None, "any node")
    assert sm90.describe() == "gres=gpu:h100:1, constraint=sm90, partition=gpu"
    assert (sm120.gres, sm120.constraint) == ("gpu:rtx5090:1", None)


def test_a_cell_of_an_arch_the_site_lacks_is_refused_naming_it(tmp_path: Path, matrix) -> None:  # type: ignore[no-untyped-def]
    site = load_fleet_site(site_file(tmp_path))
    cells = [matrix.cell("cpu-tiny-host"), matrix.cell("sm121-vllm-0.28.0-fi-0.6.18.post1-cu130")]
    with pytest.raises(InputError) as caught:
        plan_cells(cells, site)
    message = str(caught.value)
    assert (
        f"{tmp_path}/fleet.yaml:5: arch:" in message
        and "sm121-vllm-0.28.0-fi-0.6.18.post1-cu130 (arch sm121)" in message
    )
    assert "sm90 (gres=gpu:h100, constraint=sm90, partition=gpu)" in message and "cpu-tiny-host" not in message


def test_a_gpu_arch_mapped_to_any_node_is_refused(tmp_path: Path, matrix) -> None:  # type: ignore[no-untyped-def]
    site = load_fleet_site(site_file(tmp_path, SITE.replace('sm120: {gres: "gpu:rtx5090"}', "sm120: {}")))
    with pytest.raises(InputError, match=r"fleet.yaml:8: arch.sm120: GPU arch sm120 maps to any node"):
        plan_cells([matrix.cell("sm120-vllm-0.28.0-release")], site)


def test_gpu_count_reads_tensor_and_pipeline_parallel(matrix) -> None:  # type: ignore[no-untyped-def]
    cell = matrix.cell("h200-vllm-0.26.0-tiny")
    assert gpu_count(matrix.cell("cpu-tiny-host")) == 0 and gpu_count(cell) == 1
    assert cell.serve is not None
    wide = type(cell.serve)(**{**cell.serve.__dict__, "args": ("--tensor-parallel-size", "2", "-pp=2")})
    assert gpu_count(type(cell)(**{**cell.__dict__, "serve": wide})) == 4


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("scheduler: slurm", "scheduler: kubernetes", "fleet.yaml:2: scheduler: 'kubernetes' is not a scheduler here"),
        ("shared_dir: /shared/fleet", "shared_dir: shared", "fleet.yaml:3: shared_dir: an absolute directory"),
        ("  none: {}", "  none: {gpus: 2}", "fleet.yaml:6: arch.none.gpus: unknown key"),
        ('gres: "gpu:h100"', 'gres: "gpu h100"', "fleet.yaml:7: arch.sm90.gres: 'gpu h100' is not a GRES"),
        ("  sm120:", "  hopper:", "fleet.yaml:8: arch.hopper: 'hopper' is not an arch"),
        (
            "schema_version: 1",
            "schema_version: 1\nshard_dir: /x",
            "fleet.yaml:2: shard_dir: unknown key, did you mean 'shared_dir'?",
        ),
        (
            "constraint: sm90",
            "constraint: 'sm90;rm'",
            "fleet.yaml:7: arch.sm90.constraint: 'sm90;rm' is not feature names",
        ),
    ],
)
def test_a_bad_site_file_is_exit_2_naming_file_line_and_field(tmp_path: Path, old: str, new: str, where: str) -> None:
    path = site_file(tmp_path, SITE.replace(old, new))
    with pytest.raises(InputError) as caught:
        load_fleet_site(path)
    assert caught.value.exit_code == 2 and where in str(caught.value), str(caught.value)


def test_sbatch_options_and_a_job_line(tmp_path: Path, matrix) -> None:  # type: ignore[no-untyped-def]
    placement = plan_cells([matrix.cell("h200-vllm-0.26.0-tiny")], load_fleet_site(site_file(tmp_path)))[0]
    request = JobRequest(placement=placement, name="stackproof-x", script=tmp_path / "job.sh", workdir=tmp_path,
                         output=tmp_path / "job.out", time_limit_min=30)  # fmt: skip
    argv = sbatch_argv(request)
    assert {"--no-requeue", "--gres=gpu:h100:1", "--constraint=sm90", "--partition=gpu", "--time=30"} <= set(argv)
    running = parse_job_line(
        "JobId=7 JobName=stackproof-x JobState=RUNNING Reason=None ExitCode=0:0 SubmitTime=2026-12-06T20:10:00 "
        "StartTime=2026-12-06T20:10:01 EndTime=2027-12-06T20:10:01 NodeList=vm BatchHost=vm"
    )
    assert (running.state, running.node, running.reason, running.exit_code, running.finished) == (
        "RUNNING",
        "vm",
        None,
        None,
        False,
    )
    assert running.started_at is not None and running.submitted_at is not None and running.ended_at is None
    lost = parse_job_line("JobId=8 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:9 NodeList=vm2 StartTime=Unknown")
    assert (lost.state, lost.reason, lost.signal, lost.finished, lost.started_at) == (
        "NODE_FAIL",
        "NodeDown",
        9,
        True,
        None,
    )

"""Keeping up without a person, end to end (no docker): a stand-in vLLM release appears on a local
index on 127.0.0.1, and `stackproof matrix propose --new` turns it into proposed, validated and audited
cells, a patch and a pull-request body (benchmarks/stacks/release_to_proposal.py). Measured: the
seconds from the wheel's appearance to the written proposal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def test_a_new_release_on_the_index_becomes_audited_proposed_cells(tmp_path: Path) -> None:
    script = REPO / "benchmarks" / "stacks" / "release_to_proposal.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert [(n["package"], n["version"]) for n in summary["new"]] == [("vllm", "0.35.0")]
    assert summary["cells"] == ["sm120-vllm-0.35.0-release", "sm121-vllm-0.35.0-release"]
    # The stand-in wheels carry no source: the audit ran and says what it cannot find (exit 1).
    assert summary["exit"] == 1 and summary["audit_errors"][0] > 0
    assert summary["files"] == ["pr-body.md", "proposal.patch"]
    patch = (tmp_path / "proposal" / "proposal.patch").read_text()
    # The value as the YAML emitter quotes it (pipeline/guard/yamltext.py), single or double.
    assert re.search(r"""\+    image: ['"]vllm/vllm-openai:v0\.35\.0['"]""", patch), patch[:2000]
    assert "+  - id: sm121-vllm-0.35.0-release" in patch
    assert '"0.35.0"' in patch  # the release-pin table's new entry
    body = (tmp_path / "proposal" / "pr-body.md").read_text()
    assert "- vllm 0.35.0 (index `pypi`; the matrix's newest: 0.34.0)" in body
    print(f"release to audited proposal: {summary['seconds_release_to_proposal']} s")

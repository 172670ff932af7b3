"""Matrix texts that the test_matrix_* files share: `doc` to write YAML inside a test function, a
minimal `CELL`, and `INVALID`, the table of invalid matrices with every problem each must give
(test_matrix_errors.py runs it)."""

from __future__ import annotations

import pytest

SOURCE_INDENT = " " * 8
ANYWHERE = "(set it in the cell, an ancestor or defaults)"
TOOL_OWNED = "the tool sets --host 127.0.0.1 and --port itself"

CELL = """\
cells:
  - id: a
    base: img
    platform: linux/amd64
    arch: none
"""


def doc(*parts: str) -> str:
    """Join YAML snippets written inside test functions: 8 spaces of source indentation are column 0."""
    lines = []
    for part in parts:
        for line in part.splitlines(keepends=True):
            if not line.strip():
                line = "\n" if line.endswith("\n") else ""
            elif line.startswith(SOURCE_INDENT):
                line = line[len(SOURCE_INDENT) :]
            lines.append(line)
    return "".join(lines)


# Each an invalid matrix and every problem it must give, each located: (the matrix text after the
# header, [(a marker on the line, the message after `FILE:LINE: `), ...]).
INVALID = [
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/amd64
            arhc: none
    """),
        [
            ("arhc:", "cells[0].arhc: unknown key, did you mean 'arch'?"),
            ("- id: a", f"cells[0]: missing required key 'arch' {ANYWHERE}"),
        ],
        id="unknown_cell_key_with_did_you_mean",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            serve:
              model: {source: "path:/m"}
              readiness_timout: 10
    """,
        ),
        [
            ("readiness_timout", "cells[0].serve.readiness_timout: unknown key, did you mean 'readiness_timeout'?"),
        ],
        id="unknown_nested_key_with_did_you_mean",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            arch: sm90
    """,
        ),
        [
            ("arch: sm90", "cells[0].arch: duplicate key"),
        ],
        id="duplicate_yaml_mapping_key",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            env:
              A: "one"
              A: "two"
    """,
        ),
        [
            ("two", "cells[0].env.A: duplicate key"),
        ],
        id="duplicate_key_in_nested_mapping",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            extends: b
          - id: b
            extends: a
            base: img
            platform: linux/amd64
            arch: none
    """),
        [
            ("extends: a", "cells[1].extends: extends cycle: a -> b -> a"),
            ("extends: b", "cells[0].extends: extends cycle: b -> a -> b"),
        ],
        id="extends_cycle",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            extends: a
    """,
        ),
        [
            ("extends: a", "cells[0].extends: extends cycle: a -> a"),
        ],
        id="extends_itself",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            overrides:
              six:
                version: "1.16.0"
                index: pypy
    """,
        ),
        [
            ("index: pypy", "cells[0].overrides.six.index: undeclared index 'pypy', did you mean 'pypi'?"),
        ],
        id="undeclared_index_in_overrides",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            install:
              requirements:
                torch: {version: "~=2.0", index: pypi}
              lock: a.lock.json
    """,
        ),
        [
            (
                "torch:",
                "cells[0].install.requirements.torch.version: '~=2.0' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
        ],
        id="install_requirement_versions_must_be_exact",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/arm46
            arch: sm90a
    """),
        [
            ("platform:", "cells[0].platform: unknown platform 'linux/arm46', did you mean 'linux/arm64'?"),
            ("arch:", "cells[0].arch: unknown arch 'sm90a', did you mean 'sm90'?"),
        ],
        id="unknown_arch_and_platform_reported_together",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            arms:
              fast:
                args: [--enforce-eager, --port=1]
    """,
        ),
        [
            ("--port=1", f"cells[0].arms.fast.args[1]: '--port=1': {TOOL_OWNED}"),
        ],
        id="tool_owned_arm_args",
    ),
    pytest.param(
        doc(
            """\
          on-b: {cell: aa}
          on-c: {cell: zzz}
    """,
            CELL,
        ),
        [
            ("on-b:", "bases.on-b.cell: no cell 'aa', did you mean 'a'?"),
            ("on-c:", "bases.on-c.cell: no cell 'zzz'"),
        ],
        id="base_naming_unknown_cell",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: imgg
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: imgg", "cells[0].base: no base 'imgg', did you mean 'img'?"),
        ],
        id="cell_unknown_base_with_did_you_mean",
    ),
    pytest.param(
        doc("""\
          self: {cell: a}
        cells:
          - id: a
            base: self
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: self", "cells[0].base: base 'self' is this cell's own image"),
        ],
        id="cell_whose_base_is_its_own_image",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: Bad_Id
            base: img
            platform: linux/amd64
            arch: none
            env: {"1BAD": x}
            serve:
              model: {source: "s3://bucket/model"}
              readiness_timeout: -5
    """),
        [
            ("Bad_Id", "cells[0].id: 'Bad_Id' is not a valid cell id"),
            (
                "s3://",
                "cells[0].serve.model.source: 's3://bucket/model' is not a valid model source (hf:org/name or path:/dir/in/image)",
            ),
            ("readiness_timeout", "cells[0].serve.readiness_timeout: must be a positive number of seconds, got -5"),
            ("1BAD", "cells[0].env.1BAD: '1BAD' is not a valid environment variable name"),
        ],
        id="invalid_ids_env_names_and_model_sources",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            runner: self-hosted
            env: [A]
            expect: {outcome: pass, stage: autotuning, reason: x, match: x}
    """,
        ),
        [
            ("outcome:", "cells[0].expect.outcome: unknown expected outcome 'pass'"),
            ("outcome:", "cells[0].expect.stage: unknown stage 'autotuning', did you mean 'autotune'?"),
            ("runner:", "cells[0].runner: must be a list, got a string"),
            ("env: [A]", "cells[0].env: must be a mapping of NAME: value, got a list"),
        ],
        id="wrong_types_are_located",
    ),
    pytest.param(
        doc("""\
        defaults:
          arch: sm999
          serve:
            model: {source: "path:/m"}
            args: [--port, "1"]
        cells:
          - id: a
            base: img
            platform: linux/amd64
    """),
        [
            ("--port", f"defaults.serve.args[0]: '--port': {TOOL_OWNED}"),
            ("arch: sm999", "defaults.arch: unknown arch 'sm999', did you mean 'sm90'?"),
        ],
        id="error_in_value_from_defaults_points_at_defaults",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            overrides:
              six: {version: "1.0", index: pypi}
          - id: b
            extends: a
            overrides:
              six: {version: "1.*"}
    """,
        ),
        [
            (
                "1.*",
                "cells[1].overrides.six.version: '1.*' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
        ],
        id="override_in_leaf_is_located_in_the_leaf",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: img
            platform: linux/amd64
            arch: sm90x
            overrides:
              six: {version: latest, index: pypy}
          - id: b
            extends: c
    """),
        [
            (
                "six:",
                "cells[0].overrides.six.version: 'latest' is not an exact version (write one version, e.g. '0.6.18.post1')",
            ),
            ("six:", "cells[0].overrides.six.index: undeclared index 'pypy', did you mean 'pypi'?"),
            ("arch:", "cells[0].arch: unknown arch 'sm90x', did you mean 'sm90'?"),
            ("extends: c", "cells[1].extends: no cell 'c'"),
        ],
        id="several_problems_reported_at_once",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: a
            base: nope
            platform: linux/amd46
            arch: none
    """),
        [
            ("base: nope", "cells[0].base: no base 'nope'"),
            ("platform:", "cells[0].platform: unknown platform 'linux/amd46', did you mean 'linux/amd64'?"),
        ],
        id="unknown_base_does_not_hide_other_problems",
    ),
    # A base cycle round two cells: `matrix validate` says so (exit 2), not only a later `render`.
    pytest.param(
        doc("""\
          on-a: {cell: a}
          on-b: {cell: b}
        cells:
          - id: a
            base: on-b
            platform: linux/amd64
            arch: none
          - id: b
            base: on-a
            platform: linux/amd64
            arch: none
    """),
        [
            ("base: on-b", "cells[0].base: cell 'a' is its own base through a -> b -> a"),
            ("base: on-a", "cells[1].base: cell 'b' is its own base through b -> a -> b"),
        ],
        id="two_cells_that_are_each_others_base_are_rejected_with_a_location",
    ),
    pytest.param(
        doc(
            CELL,
            """\
            given:
              vllm: {version: "0.26.0", index: pypi}
    """,
        ),
        [
            (
                "given:",
                "cells[0].given: only a `runtime: host` cell, or one over an archive base, is verified in an "
                "environment it is given",
            )
        ],
        id="given_packages_on_a_docker_cell",
    ),
    pytest.param(
        doc("""\
        cells:
          - id: h
            runtime: host
            platform: linux/amd64
            arch: sm90
            install:
              requirements: {vllm: {version: "0.26.0", index: pypi}}
              lock: locks/h.lock.json
            given:
              vllm: {version: "0.26.0", index: pipy}
    """),
        [
            ("index: pipy", "cells[0].given.vllm.index: undeclared index 'pipy'"),
            ("given:", "cells[0].given: a cell with `install:` builds its environment: `given` is for one that exists"),
        ],
        id="given_packages_beside_install_and_an_undeclared_index",
    ),
]

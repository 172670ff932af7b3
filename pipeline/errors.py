"""Exceptions that end a command, each carrying the exit code the CLI contract gives it.

The CLI catches `PipelineError` once, prints the message and exits with `exit_code`; nothing
below the CLI returns an exit code as a value.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error that ends a command."""

    exit_code = 1


class CheckFailed(PipelineError):
    """A check, a build or a server start failed: the thing under test is at fault."""

    exit_code = 1


class InputError(PipelineError):
    """Bad input or usage: nothing was built or run."""

    exit_code = 2


class MatrixError(InputError):
    """A YAML input is invalid (matrix.yaml, or a rule set, the signature catalog, the autotune
    policies). Carries every problem found, each located by file and line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class InfraError(PipelineError):
    """The tool's environment is at fault: no docker daemon, registry unreachable, a tool timeout."""

    exit_code = 3


class Interrupted(PipelineError):
    """SIGINT or SIGTERM arrived; cleanup has run. 130 is the shell convention for Ctrl-C."""

    exit_code = 130

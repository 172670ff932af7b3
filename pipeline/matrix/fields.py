"""The field checks every part of the matrix reader shares: located problems, mapping keys and the
scalar shapes (text, choices, env, log rules, paths, exact versions).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from pipeline.guard.redact import secret_env
from pipeline.matrix.model import LogRule, parse_log_rule
from pipeline.matrix.schema import _ABS_PATH, _CONTROL, _ENV_NAME, AUTOTUNE_ENTRIES, _did_you_mean, _kind
from pipeline.matrix.yamlsrc import Path_, YamlSource, format_path

__all__ = ["FieldChecker"]


class FieldChecker:
    """Walks the document once, building typed values and collecting located problems."""

    def __init__(self, src: YamlSource, images_dir: Path) -> None:
        self.src = src
        self.images_dir = images_dir
        self.problems: list[str] = []
        self._seen: set[str] = set()  # problems already reported: a set, so 300,000 of them stay linear
        self.origins: dict[Path_, Path_] = {}  # merged cell path -> where in the file it came from

    # -- reporting --------------------------------------------------------------------------------

    def problem(self, path: Path_, message: str) -> None:
        where = self.origins.get(path, path)
        line = f"{self.src.file}:{self.src.line_of(where)}: {format_path(where)}: {message}"
        if line not in self._seen:  # a mistake in `defaults` or an ancestor is reported once
            self._seen.add(line)
            self.problems.append(line)

    def keys(self, path: Path_, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> bool:
        """Check `value` is a mapping with only `allowed` keys and all `required` ones."""
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping, got {_kind(value)}")
            return False
        for key in value:
            if key not in allowed:
                self.problem((*path, key), f"unknown key{_did_you_mean(str(key), allowed)}")
        missing = [key for key in required if key not in value]
        for key in missing:
            self.problem(path, f"missing required key {key!r}")
        return not missing

    # -- scalars ----------------------------------------------------------------------------------

    def text(self, path: Path_, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
        if isinstance(value, bool) or value is None or isinstance(value, dict | list):
            self.problem(path, f"must be a string, got {_kind(value)}")
            return ""
        text = self.src.text_of(self.origins.get(path, path)) or str(value)
        if pattern is not None and not pattern.match(text):
            self.problem(path, f"{text!r} is not a valid {what or 'value'}")
        return text

    def choice(self, path: Path_, value: Any, choices: tuple[str, ...], what: str) -> str:
        text = self.text(path, value)
        if value is not None and not isinstance(value, dict | list | bool) and not text:
            self.problem(path, f"must not be empty (one of {', '.join(choices)})")
        if text and text not in choices:
            self.problem(path, f"unknown {what} {text!r}{_did_you_mean(text, choices)}")
        return text

    def texts(
        self, path: Path_, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = ""
    ) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(path, f"must be a list, got {_kind(value)}")
            return ()
        return tuple(self.text((*path, i), item, pattern=pattern, what=what) for i, item in enumerate(value))

    def env(self, path: Path_, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of NAME: value, got {_kind(value)}")
            return ()
        pairs = []
        for name, item in value.items():
            if not _ENV_NAME.match(str(name)):
                self.problem((*path, name), f"{name!r} is not a valid environment variable name")
            text = self.text((*path, name), item)
            if _CONTROL.search(text):
                self.problem((*path, name), "the value holds a control character (newline, tab, escape...)")
            secret = secret_env(str(name), text)
            if secret:
                self.problem((*path, name), f"refused: {secret}; a secret never goes into matrix.yaml or an image")
            pairs.append((str(name), text))
        return tuple(sorted(pairs))

    def log_rules(self, path: Path_, value: Any, *, prefix: str) -> tuple[LogRule, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.problem(path, f"must be a list of rules like {{expect: 'regex'}}, got {_kind(value)}")
            return ()
        rules = []
        for j, item in enumerate(value):
            rule, problems = parse_log_rule(item, default_id=f"{prefix}-{j}")
            for sub, message in problems:
                self.problem((*path, j, *sub), message)
            if rule is not None:
                rules.append(rule)
        return tuple(rules)

    def autotune_entries(self, path: Path_, value: Any) -> str:
        """`autotune.entries`: whether a fresh start must tune something (default) or may tune nothing."""
        if not isinstance(value, dict) or "entries" not in value:
            return "expected"
        return self.choice((*path, "entries"), value["entries"], AUTOTUNE_ENTRIES, "autotune entries") or "expected"

    def autotune(self, path: Path_, value: Any) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        """`{forbid: [{op, runner}], allow: [{op, runner}]}` on top of the built-in autotune policies."""
        if value is None or not self.keys(path, value, ("forbid", "allow", "entries")):
            return (), ()
        lists = []
        for key in ("forbid", "allow"):
            pairs = []
            items = value.get(key) or []
            if not isinstance(items, list):
                self.problem((*path, key), f"must be a list of {{op, runner}}, got {_kind(items)}")
                items = []
            for j, item in enumerate(items):
                if self.keys((*path, key, j), item, ("op", "runner"), required=("op", "runner")):
                    pairs.append(
                        (
                            self.text((*path, key, j, "op"), item["op"]),
                            self.text((*path, key, j, "runner"), item["runner"]),
                        )
                    )
            lists.append(tuple(pairs))
        return lists[0], lists[1]

    def regex(self, path: Path_, value: Any) -> str:
        text = self.text(path, value)
        try:
            re.compile(text)
        except re.error as exc:
            self.problem(path, f"{text!r} is not a valid regular expression: {exc}")
        return text

    def env_like(self, path: Path_, value: Any, what: str) -> tuple[tuple[str, str], ...]:
        """A mapping of name: text (not environment names), e.g. accepted_conflicts."""
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.problem(path, f"must be a mapping of {what}, got {_kind(value)}")
            return ()
        return tuple((str(k), self.text((*path, k), v)) for k, v in value.items())

    def path(self, path: Path_, value: Any) -> str:
        """An absolute path inside an image, made of plain name characters (it is rendered into `RUN`)."""
        text = self.text(path, value, pattern=_ABS_PATH, what="absolute path (letters, digits, . _ + -)")
        if ".." in text.split("/"):
            self.problem(path, f"{text!r}: no `..` in the path")
        return text

    def version(self, path: Path_, value: Any) -> str:
        """An exact version, normalised once here (`1.16.0-post1` -> `1.16.0.post1`)."""
        text = self.text(path, value)
        try:
            return str(Version(text))
        except InvalidVersion:
            self.problem(path, f"{text!r} is not an exact version (write one version, e.g. '0.6.18.post1')")
        return text

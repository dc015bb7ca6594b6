"""The README is a contract: its exit codes, command list and test command match the code."""

from __future__ import annotations

import re
from pathlib import Path

from jobcoord.cli import cli
from jobcoord.errors import (
    EXIT_CODES,
    DatabaseBusy,
    DatabaseCorrupt,
    InvalidInput,
    JobcoordError,
    Refused,
    SchemaMismatch,
    StorageUnavailable,
)

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DESIGN_CODES = {0, 1, 2, 3, 4, 5, 6, 7, 8}


def test_exit_code_table_matches_the_error_classes() -> None:
    table = dict(re.findall(r"^\| (\d) \| (.+) \|$", README, re.M))
    assert {int(k) for k in table} == set(EXIT_CODES) == DESIGN_CODES
    classes = {JobcoordError: 1, InvalidInput: 2, Refused: 4, DatabaseBusy: 5,
               StorageUnavailable: 6, DatabaseCorrupt: 7, SchemaMismatch: 8}
    for cls, code in classes.items():
        assert cls.exit_code == code, cls


def test_every_command_is_documented_with_help() -> None:
    documented = set(re.findall(r"^\| `([a-z]+)", README, re.M))
    for name, command in cli.commands.items():
        assert name in documented, f"{name} missing from the README command table"
        assert command.help, f"{name} has no help text"


def test_ci_runs_the_exact_test_command_from_the_readme() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = next(line for line in README.splitlines() if "-m pytest" in line)
    assert readme_cmd.strip() in ci


def test_every_proof_named_in_the_guarantees_exists() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = set(re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)", text))
    assert named, "docs/guarantees.md names no proofs"
    for path, test in sorted(named):
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"{path}::{test} does not exist"

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
#: The exit codes of the CLI contract, and 130 for Ctrl-C (the shell's convention).
CONTRACT_CODES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 130}


def test_exit_code_table_matches_the_error_classes() -> None:
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", README, re.M))
    assert {int(k) for k in table} == set(EXIT_CODES) == CONTRACT_CODES
    assert table["130"] == EXIT_CODES[130]
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


def test_the_session_by_hand_runs_as_written(tmp_path: Path) -> None:
    """A newcomer types the README's session after the install command, in a fresh shell:
    it must activate the virtualenv itself, then every line must succeed."""
    import shutil
    import subprocess
    import sys

    if sys.prefix == sys.base_prefix:
        import pytest

        pytest.skip("the tests do not run from a virtualenv")
    block = README.split("## A session by hand", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0] == ". .venv/bin/activate", lines[0]
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the install command's virtualenv
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if not shutil.which("jobcoord", path=env["PATH"]):
        # Without the first line the next one fails: the session needs it.
        bare = subprocess.run(["bash", "-c", "\n".join(lines[1:2])], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert bare.returncode == 127, bare
    r = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert '"status": "succeeded"' in r.stdout or "status: succeeded" in r.stdout


def test_no_comment_cites_a_document_outside_the_repository() -> None:
    """Comments once cited a design document that is not in the repository: a reader could
    not follow them. What they meant now lives in README.md and docs/."""
    missing = "DESIGN" + ".md"  # spelled apart so this file does not cite it either
    for folder in ("jobcoord", "tests", "docs", "benchmarks", "examples", "alembic"):
        for source in (ROOT / folder).rglob("*"):
            if source.suffix in (".py", ".md") and source.is_file():
                assert missing not in source.read_text(), source


def test_the_busy_timeouts_documented_tries_are_the_stores() -> None:
    """`--busy-timeout` bounds each try, not the whole wait: README.md and the option's
    help say how many tries a busy transaction gets, which is the store's number."""
    from jobcoord.store.base import DEFAULT_RETRIES

    said = f"tried up to {DEFAULT_RETRIES} times"
    assert said in " ".join(README.split()), said
    option = next(p for p in cli.params if p.name == "busy_timeout")
    assert said in str(getattr(option, "help", "")), option

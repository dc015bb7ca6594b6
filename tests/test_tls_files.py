"""The certificate files a command is pointed at (`--ca-file` of `worker --server`,
`checkpoint` and `effect`; `serve --tls-cert/--tls-key`) are checked before anything else
happens: a file that is missing, a directory, not PEM, or not a regular file (a FIFO, whose
writer may never write) is exit 2 (invalid_input) naming the option and the file, never
exit 1 or a hang, and nothing is opened or created."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jobcoord.db import Target
from tests.serve_procs import db_args, jobcoord_argv, served, terminated, token, token_file

FAKE_CERT = b"-----BEGIN CERTIFICATE-----\nTUlJ\n-----END CERTIFICATE-----\n"
SERVER = "https://127.0.0.1:9"


def _argv(option: str, path: str, tmp: Path) -> list[str]:
    """The command line giving `path` as `option`."""
    token = tmp / "token"
    if not token.exists():
        token.write_text("jct_dummytoken\n")
        token.chmod(0o600)
        (tmp / "cert.pem").write_bytes(FAKE_CERT)
    remote = ["--server", SERVER, "--token-file", str(token), "--ca-file", path, "--json"]
    if option == "worker --ca-file":
        return ["worker", "--exec", "k=true", "--burst", *remote]
    if option == "checkpoint --ca-file":
        return ["checkpoint", "1", "--worker", "w", "--epoch", "1", "--name", "n", *remote]
    if option == "effect --ca-file":
        return ["effect", "1", "--worker", "w", "--epoch", "1", *remote]
    serve = ["--db", str(tmp / "q.db"), "serve", "--port", "0", "--json"]
    if option == "serve --tls-cert":
        return [*serve, "--tls-cert", path, "--tls-key", path]
    return [*serve, "--tls-cert", str(tmp / "cert.pem"), "--tls-key", path]


OPTIONS = ["worker --ca-file", "checkpoint --ca-file", "effect --ca-file", "serve --tls-cert",
           "serve --tls-key"]


def _make(case: str, tmp: Path) -> tuple[str, str]:
    """A bad file of this case, and what the message says of it."""
    if case == "missing":
        return str(tmp / "no-such.pem"), "No such file"
    if case == "directory":
        (tmp / "dir.pem").mkdir()
        return str(tmp / "dir.pem"), "directory"
    if case == "fifo":
        os.mkfifo(tmp / "pipe.pem")
        return str(tmp / "pipe.pem"), "not a regular file"
    if case == "odd-name-missing":
        return str(tmp / "my ca #1 100%.pem"), "No such file"
    name = tmp / ("my ca #2 100%.pem" if case == "odd-name" else "garbage.pem")
    name.write_bytes(b"garbage\n")
    return str(name), "not PEM"


@pytest.mark.parametrize("case", ["missing", "directory", "not-pem", "fifo", "odd-name",
                                  "odd-name-missing"])
@pytest.mark.parametrize("option", OPTIONS)
def test_a_bad_certificate_file_is_invalid_input_naming_it(
        tmp_path: Path, option: str, case: str) -> None:
    path, said = _make(case, tmp_path)
    writer = os.open(path, os.O_RDWR) if case == "fifo" else None  # a writer that stays
    try:
        start = time.monotonic()
        got = subprocess.run([*jobcoord_argv(), *_argv(option, path, tmp_path)],
                             capture_output=True, timeout=60, check=False)
        took = time.monotonic() - start
    finally:
        if writer is not None:
            os.close(writer)
    assert got.returncode == 2, (got.stdout.decode(), got.stderr.decode()[-2000:])
    error: dict[str, Any] = json.loads(got.stdout.decode().splitlines()[-1])["error"]
    assert error["code"] == "invalid_input", error
    assert option.split()[1] in error["message"] and path in error["message"], error
    assert said in error["message"], error
    assert took < 15, took
    assert not (tmp_path / "q.db").exists()  # serve opened no database


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(tmp_path: Path) -> Path:
    """A directory holding a CA (ca.pem, ca.key) and a server certificate for 127.0.0.1 it
    signed (srv.pem, srv.key)."""
    d = tmp_path / "tls dir #1"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=test ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "srv.pem", "-days", "2", "-extfile", "ext", cwd=d)
    return d


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_good_ca_file_and_server_certificate_still_work_and_a_mismatch_is_refused(
        target: Target, tmp_path: Path) -> None:
    """A CA and a server certificate it signed: `serve` loads them and `checkpoint --ca-file`
    reaches it (its answer is the server's, not a TLS failure). A key that is not the
    certificate's, or an encrypted one, is exit 2 naming both files, never a pass phrase
    prompt."""
    d = _certificates(tmp_path)
    _openssl("rsa", "-in", "srv.key", "-aes256", "-passout", "pass:x", "-out", "enc.key",
             cwd=d)
    secret = token(target, "w", "worker", worker="w")
    path = token_file(tmp_path, "w.token", secret)
    with served(target, "--tls-cert", str(d / "srv.pem"), "--tls-key", str(d / "srv.key")) as s:
        assert s.url.startswith("https://")
        got = subprocess.run(
            [*jobcoord_argv(), "checkpoint", "1", "--worker", "w", "--epoch", "1", "--name",
             "n", "--server", s.url, "--token-file", path, "--ca-file", str(d / "ca.pem"),
             "--json"], capture_output=True, timeout=60, check=False)
        assert got.returncode == 4, got.stdout.decode() + got.stderr.decode()[-2000:]
        assert json.loads(got.stdout)["error"]["code"] == "job_not_found"
    for key in ("ca.key", "enc.key"):
        got = subprocess.run(
            [*jobcoord_argv(), *db_args(target), "serve", "--port", "0", "--json",
             "--tls-cert", str(d / "srv.pem"), "--tls-key", str(d / key)],
            capture_output=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
        assert got.returncode == 2, got.stderr.decode()[-2000:]
        error = json.loads(got.stdout.decode().splitlines()[-1])["error"]
        assert error["code"] == "invalid_input" and str(d / key) in error["message"], error


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_sigterm_cuts_an_idle_remote_workers_long_poll_over_tls_short(
        target: Target, tmp_path: Path) -> None:
    """Over TLS too: SIGTERM ends an idle remote worker's long-poll at once. The socket kept
    to be shut was the one TLS had taken over (closed under it), so the cut did nothing and
    the worker sat out the whole poll (20 s)."""
    d = _certificates(tmp_path)
    secret = token(target, "w", "worker", worker="w")
    path = token_file(tmp_path, "w.token", secret)
    with served(target, "--reap-every", "0", "--tls-cert", str(d / "srv.pem"),
                "--tls-key", str(d / "srv.key")) as s:
        proc = subprocess.Popen(
            [*jobcoord_argv(), "worker", "--server", s.url, "--token-file", path,
             "--ca-file", str(d / "ca.pem"), "--exec", "k=true", "--readings-override",
             '{"memory_used_pct": 10}', "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(3.0)  # started, found nothing, polling
        out, err, took = terminated(proc)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert json.loads(out.decode().splitlines()[-1])["claimed"] == 0
    assert took < 5, took

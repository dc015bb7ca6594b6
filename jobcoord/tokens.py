"""API tokens: trusted identity for the HTTP server.

A token is `jct_` followed by 32 random bytes (URL-safe base64). It is shown once, when it is
created; the database keeps only its SHA-256 hash. A request is authenticated by hashing the
presented secret, looking the hash up, and comparing it in constant time. A token's identity
never changes (a token is only ever revoked); whether it is still live is judged again on
every request (the server: inside the request's own write transaction, see
`Server.call_as`), so a revocation takes effect on the very next request.

Each function is one short transaction with parameterized SQL, no I/O inside it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from . import validate as v
from .clock import iso, now_us
from .errors import InvalidInput, Refused
from .store import feature_statements as fs

ROLES = ("submitter", "worker", "viewer", "operator")
PREFIX = "jct_"
#: Longest secret accepted from a request (a real one is 47 characters): anything longer is
#: refused before it is hashed.
MAX_SECRET = 256


@dataclass(frozen=True)
class Identity:
    """Who is calling: everything an HTTP request may act as comes from here, never from the
    request body."""

    name: str
    role: str
    tenant: str | None
    worker_id: str | None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def create(db: Any, name: str, role: str, *, tenant: str | None = None,
           worker: str | None = None) -> dict[str, Any]:
    """Create a token; the answer carries the secret (JSON key `token`) this one time."""
    name = v.name(name, "name")
    role = v.exact_text(role)  # judged, and stored, by its characters
    if role not in ROLES:
        raise InvalidInput("invalid_input", f"role must be one of {', '.join(ROLES)}",
                           field="role")
    tenant = v.optional_name(tenant, "tenant")
    worker = None if worker is None else v.name(worker, "worker", max_len=v.MAX_WORKER_ID)
    if role == "worker" and worker is None:
        raise InvalidInput("invalid_input", "a worker token needs --worker ID: the worker id "
                           "comes from the token, never from a request", field="worker")
    if role != "worker" and worker is not None:
        raise InvalidInput("invalid_input", "--worker is only for --role worker",
                           field="worker")
    secret = new_secret()
    digest = hash_secret(secret)
    now = now_us()

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        taken = db.run(conn, fs.TOKEN_NAMED, {"name": name}).first()
        if taken is not None:
            return Refused("token_exists", f"a token named {name!r} already exists (revoked "
                           "tokens keep their name); choose another name", name=name)
        if worker is not None:
            # One worker row per id, which carries no tenant: tokens of two bindings acting
            # as one id let one tenant's token rewrite the other's worker (its kinds and
            # readings, so its gates) and an unbound one renew its leases. Held against other
            # writers of tokens: two creates at once (PostgreSQL, READ COMMITTED) each found
            # no other binding and both inserted theirs.
            db.lock_exclusive(conn, ["tokens"])
            other = next((r for r in db.run(conn, fs.LIVE_TOKENS_OF_WORKER,
                                            {"worker": worker}) if r[1] != tenant), None)
            if other is not None:
                bound = "every tenant" if other[1] is None else f"tenant {other[1]!r}"
                return Refused(
                    "worker_id_taken", f"worker id {worker!r} is already the worker of token "
                    f"{other[0]!r}, bound to {bound}: one worker id serves one tenant binding. "
                    f"Choose another worker id, or revoke {other[0]!r} first", worker=worker,
                    token=other[0])
        db.run(conn, fs.INSERT_TOKEN, {"name": name, "hash": digest, "role": role,
                                       "tenant": tenant, "worker": worker, "now": now})
        return {"name": name, "role": role, "tenant": tenant, "worker_id": worker,
                "created_at": iso(now), "token": secret}

    return db.write(_do, "token create")


def list_tokens(db: Any) -> dict[str, Any]:
    """Every token, without its hash."""
    rows = db.read(lambda conn: db.run(conn, fs.ALL_TOKENS).all(), "token ls")
    return {"tokens": [
        {"name": r[0], "role": r[1], "tenant": r[2], "worker_id": r[3],
         "created_at": iso(r[4]), "revoked": r[5] is not None, "revoked_at": iso(r[5])}
        for r in rows]}


def revoke(db: Any, name: str) -> dict[str, Any]:
    """Revoke a token by name: its next request is refused (401)."""
    name = v.name(name, "name")
    now = now_us()

    def _do(conn: Connection) -> dict[str, Any] | Refused:
        row = db.run(conn, fs.TOKEN_REVOKED_AT, {"name": name}).first()
        if row is None:
            return Refused("token_not_found", f"no token named {name!r}", name=name)
        if row[0] is None:
            db.run(conn, fs.REVOKE_TOKEN, {"now": now, "name": name})
        return {"name": name, "revoked": True, "revoked_at": iso(row[0] or now)}

    return db.write(_do, "token revoke")


def article(role: str) -> str:
    """"an" before a role that starts with a vowel (an operator token), else "a"."""
    return "an" if role[:1] in ("a", "e", "i", "o", "u") else "a"


def authenticate(db: Any, secret: str) -> Identity | None:
    """The identity of a live token, or None for an unknown or revoked one."""
    digest = digest_of(secret)
    if digest is None:
        return None
    return db.read(lambda conn: live_identity(db, conn, digest), "authenticate")


def digest_of(secret: Any) -> str | None:
    """The hash a presented secret is looked up by; None for one no token can have."""
    if not isinstance(secret, str) or not secret or len(secret) > MAX_SECRET \
            or not secret.isascii():  # every secret is ASCII (a lone surrogate hashed raised)
        return None
    return hash_secret(secret)


def live_identity(db: Any, conn: Connection, digest: str) -> Identity | None:
    """The identity of the live token with this hash, read in the open transaction; None for
    an unknown or revoked one. The one place a token's liveness is judged: a request's
    authentication, a waiting long-poll's handover, a dashboard session."""
    row = db.run(conn, fs.TOKEN_BY_HASH, {"hash": digest}).first()
    # The lookup is by hash (an attacker cannot steer it byte by byte); the final comparison
    # is constant-time all the same.
    if row is None or not hmac.compare_digest(row[4], digest) or row[5] is not None:
        return None
    return Identity(name=row[0], role=row[1], tenant=row[2], worker_id=row[3])

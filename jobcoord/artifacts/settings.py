"""Per-kind artifact rules (size, media types, validator) and where the object store is:
the settings every artifact operation reads before it touches rows or bytes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import secrets
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jobcoord.artifacts.files import (
    flock_within,
    fsync_dir,
    mkdir_once,
    open_regular,
    store_error,
)
from jobcoord.artifacts.names import (  # noqa: F401 -- the artifacts API, as before
    DEFAULT_MEDIA_TYPE,
    MEDIA_TYPE,
    media_type_of,
)
from jobcoord.artifacts.objects import ObjectStore, parse_digest
from jobcoord.errors import (
    DatabaseBusy,
    InvalidInput,
    JobcoordError,
    Refused,
    SchemaMismatch,
    StorageUnavailable,
)
from jobcoord.store.feature_statements import OBJECTS_LOOKED_FOR

if TYPE_CHECKING:
    from jobcoord.coordinator import Coordinator
    from jobcoord.store import Database

ENV_STORE = "JOBCOORD_ARTIFACTS"
#: How long gc waits for uploads that are committing their rows (seconds).
GC_LOCK_WAIT_S = 60.0
MANIFEST = "manifest.json"  # in a backup's artifact directory
LOCK_FILE = "gc.lock"  # in the store's root: uploads hold it shared, gc exclusive


# --- validation rules per kind --------------------------------------------------------------


@dataclass(frozen=True)
class KindRule:
    """What the artifacts of one kind must satisfy to be accepted."""

    max_bytes: int | None = None
    media_types: tuple[str, ...] | None = None  # None: any
    validator: tuple[str, ...] | None = None  # argv; the stored file's path is appended

    def check_static(self, size: int, media_type: str) -> str | None:
        if self.max_bytes is not None and size > self.max_bytes:
            return "artifact_too_large"
        if self.media_types is not None and media_type.lower() not in self.media_types:
            return "media_type_not_allowed"
        return None


@dataclass
class ArtifactSettings:
    """Per-kind rules (`rules[kind]`; `default` for kinds without their own)."""

    default: KindRule = field(default_factory=KindRule)
    rules: dict[str, KindRule] = field(default_factory=dict)

    def for_kind(self, kind: str) -> KindRule:
        return self.rules.get(kind, self.default)


def kind_rule(max_bytes: Any = None, media_types: Any = None, validator: Any = None,
              where: str = "artifacts", path: str = "") -> KindRule:
    """A validated KindRule (InvalidInput `invalid_policy` naming `where` and the key, as
    `path` + key, otherwise)."""
    def bad(key: str, value: Any, why: str) -> InvalidInput:
        return InvalidInput("invalid_policy",
                            f"{where}: {path}{key} = {ascii(value)[:80]}: {why}")

    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or not 0 <= max_bytes <= 2**62):
        raise bad("max_bytes", max_bytes, "must be a whole number of bytes, 0..2**62")
    if media_types is not None:
        # A list only: a string or a table would be iterated character by character or
        # key by key, and a number not at all.
        if isinstance(media_types, str) or not isinstance(media_types, Sequence) or not all(
                isinstance(m, str) and MEDIA_TYPE.fullmatch(m) for m in media_types):
            raise bad("media_types", media_types,
                      "must be a list of media types like 'application/pdf'")
        media_types = tuple(m.lower() for m in media_types)  # as stored (names.py)
    if validator is not None:
        original = validator
        if isinstance(validator, str):
            try:
                validator = shlex.split(validator)
            except ValueError as e:  # an unclosed quote or a trailing backslash
                raise bad("validator", original,
                          f"cannot be split into arguments ({e})") from None
        if not isinstance(validator, Sequence) or not validator or not all(
                isinstance(a, str) and "\0" not in a for a in validator):
            raise bad("validator", original,
                      "must be a command (a string or a list of arguments)")
        if not validator[0].strip():
            # Nothing to run: every artifact of the kind would fail `validator_failed`.
            raise bad("validator", original, "names no program (its first argument is "
                      "empty)")
        validator = tuple(validator)
    return KindRule(max_bytes, media_types, validator)


def settings_from_mapping(data: Any, source: str = "policy") -> ArtifactSettings:
    """The `[artifacts]` table of a policy file (None: the file has none): defaults, and
    `[artifacts.kinds.<kind>]`. Every value is checked for its type and shape, so a wrong
    one is `invalid_policy` naming its key path, never a crash or silently skipped."""
    out = ArtifactSettings()
    if data is None:
        return out
    if not isinstance(data, Mapping):  # `artifacts = false` or `[]` too: never ignored
        raise InvalidInput("invalid_policy", f"{source}: artifacts must be a table "
                           f"([artifacts]), not {type(data).__name__}")
    keys = ("max_bytes", "media_types", "validator")
    for key in data:
        if key not in (*keys, "kinds"):
            raise InvalidInput("invalid_policy", f"{source}: unknown setting artifacts.{key} "
                               f"(artifacts takes {', '.join((*keys, 'kinds'))})")
    out.default = kind_rule(data.get("max_bytes"), data.get("media_types"),
                            data.get("validator"), source, "artifacts.")
    kinds = data.get("kinds", {})
    # A table only: a list of pairs went through dict() and was accepted.
    if not isinstance(kinds, Mapping):
        raise InvalidInput("invalid_policy", f"{source}: artifacts.kinds must be a table "
                           f"([artifacts.kinds.<kind>]), not {type(kinds).__name__}")
    for kind, rule in kinds.items():
        if not isinstance(rule, Mapping):
            raise InvalidInput("invalid_policy", f"{source}: artifacts.kinds.{kind} must be "
                               f"a table ([artifacts.kinds.{kind}]), not "
                               f"{type(rule).__name__}")
        for key in rule:
            if key not in keys:
                raise InvalidInput("invalid_policy", f"{source}: unknown setting "
                                   f"artifacts.kinds.{kind}.{key} (a kind takes "
                                   f"{', '.join(keys)})")
        merged = {"max_bytes": out.default.max_bytes, "media_types": out.default.media_types,
                  "validator": out.default.validator, **rule}
        out.rules[str(kind)] = kind_rule(merged["max_bytes"], merged["media_types"],
                                         merged["validator"], source,
                                         f"artifacts.kinds.{kind}.")
    return out


def settings_of(coord: Coordinator) -> ArtifactSettings:
    found = getattr(coord, "artifact_settings", None)
    if found is None:
        found = getattr(coord.policy, "artifacts", None) or ArtifactSettings()
    return found


def declare_kind(coord: Coordinator, kind: str, *, max_bytes: int | None = None,
                 media_types: Sequence[str] | None = None,
                 validator: str | Sequence[str] | None = None) -> None:
    """Declare a kind's artifact rules from Python (a handler's application does this)."""
    settings = getattr(coord, "artifact_settings", None)
    if settings is None:
        base = settings_of(coord)
        settings = ArtifactSettings(base.default, dict(base.rules))
        coord.artifact_settings = settings  # type: ignore[attr-defined]
    settings.rules[kind] = kind_rule(max_bytes, media_types, validator, f"kind {kind!r}")


# --- where the store is ---------------------------------------------------------------------


def store_root(db: Database, explicit: str | os.PathLike[str] | None = None) -> str:
    """The store directory: the explicit one (--artifacts), else $JOBCOORD_ARTIFACTS, else for
    SQLite `<database>.artifacts`; PostgreSQL has no default."""
    if explicit is not None and not os.fspath(explicit):
        # (As `--db ""` is refused: an empty --artifacts, a variable of the caller's that
        # was never set, took the default store and ran gc there.)
        raise InvalidInput("invalid_input", "--artifacts must be a directory path, not empty")
    root = explicit or os.environ.get(ENV_STORE)
    if root:
        return os.path.abspath(os.fspath(root))
    if db.target.sqlite_path:
        return db.target.sqlite_path + ".artifacts"
    raise InvalidInput("artifact_store_required",
                       "artifacts on PostgreSQL need a store directory: pass --artifacts DIR "
                       f"(or set {ENV_STORE}); every coordinator and worker must name the same "
                       "one")


def store_of(coord: Coordinator) -> ObjectStore:
    return ObjectStore(store_root(coord.db, getattr(coord, "artifacts_dir", None)))


def need_feature(coord: Coordinator) -> None:
    if not coord.has_feature("artifacts"):
        raise SchemaMismatch("feature_missing", "artifact storage is not installed in this "
                             "database: run `jobcoord migrate --with artifacts`")


def location_of(digest: str) -> str:
    h = parse_digest(digest)
    return f"objects/sha256/{h[:2]}/{h[2:4]}/{h}"


@contextlib.contextmanager
def gc_lock(store: ObjectStore, exclusive: bool, wait_s: float = GC_LOCK_WAIT_S,
            *, reading: bool = False, create: bool = True,
            dry_run: bool = False) -> Iterator[None]:
    """Uploads committing their row hold this shared; gc holds it exclusive while it decides
    and deletes, so an object is never deleted between an upload's `put` and its row.

    `reading`: the holder only reads objects (a backup), so where there is no store it makes
    none and holds nothing: gc deletes nothing in a store that is not there. `create=False`:
    the holder found the store there (a stage that stored its bytes, gc); gone since, it is
    not made again, empty (InvalidInput `artifact_store_missing`). `dry_run`: the lock
    taken only where its file is already (a dry run makes nothing; where no file is, no
    process holds the lock)."""
    if reading and not store.present():
        yield
        return
    if create and not reading:
        store._ensure_layout()
    elif not store.present():
        raise store._gone()
    else:
        # A store already there needs only its lock file: a reader, a dry run or a refused
        # command makes nothing else in it. Its layout is looked at all the same (`tmp/`
        # by gc only, which cleans it).
        store.refuse_broken_layout(tmp=not reading)
    path = os.path.join(store.root, LOCK_FILE)
    unlocked = False
    try:
        # Never through a link: a lock file made where it points is made outside the store.
        # Those that change nothing open it read-only (flock needs no write access): on a
        # store mounted read-only they still work.
        # Never waiting either (a fifo there), and a regular file only.
        fd = open_regular(path, (os.O_RDONLY if dry_run or reading else os.O_RDWR)
                          | os.O_NOFOLLOW | (0 if dry_run else os.O_CREAT))
    except OSError as exc:  # a link, a directory or an unreadable file where the lock goes
        # No lock file for a dry run: nobody holds the lock, and the dry run makes none.
        # None can be made by a reader on a read-only store, where no gc deletes either
        # (one read-only only here, written elsewhere: a backup re-hashes every object, and
        # fails exit 7 on one deleted under it, never a backup missing one). A dry run,
        # which never makes the file, meets that as a file not there.
        unlocked = store.present() and (
            (isinstance(exc, FileNotFoundError) and dry_run)
            or (exc.errno == errno.EROFS and reading))
        if not unlocked:
            if not (create and not reading) and not store.present():
                raise store._gone() from None  # it went since the look above
            raise store_error(exc, store.root, f"opening its gc lock {path!r}") from None
    if unlocked:
        yield
        return
    try:
        flock_within(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, wait_s,
                     lambda: DatabaseBusy("artifact_store_busy", "the artifact store's gc "
                                          f"lock was held for {wait_s:.0f} s; try again"))
        yield
    finally:
        os.close(fd)


# --- which databases use the store ----------------------------------------------------------

#: One file per database that staged or restored artifacts into the store, naming it.
USERS_DIR = "databases"


def database_identity(db: Database) -> str:
    """What names this database to a store, the same from every process using it: a SQLite
    file by its real path; a PostgreSQL database by its cluster's system identifier, its
    name and its schema (however a URL spells the host, the server says which it is)."""
    found = getattr(db, "_artifact_store_identity", None)
    if found is None:
        if db.target.sqlite_path:
            found = sqlite_identity(db.target.sqlite_path)
        else:
            try:
                row = db.read(lambda conn: conn.exec_driver_sql(
                    "SELECT system_identifier, current_database(), current_schema() "
                    "FROM pg_control_system()").one(), "naming the database to its store")
                found = f"postgresql:{row[0]}/{row[1]}/{row[2]}"
            except JobcoordError as e:
                # Only an error the store could not class (a passing one is DatabaseBusy or
                # StorageUnavailable, whatever its SQLSTATE), and only these answers.
                if type(e) is not JobcoordError or _sqlstate(e) not in _NOT_READABLE:
                    # The server unreachable, busy, read-only...: passing, and not kept (a
                    # name made up now was kept for the process's life): the next look
                    # names it.
                    raise
                # A server that does not let this role read its identifier: the URL's host,
                # port and name (two spellings of one server then look like two databases,
                # and gc is refused: never the other way round).
                from sqlalchemy.engine import make_url

                url = make_url(db.target.url)
                found = (f"postgresql://{url.host or ''}:{url.port or 5432}/"
                         f"{url.database or ''}")
        db._artifact_store_identity = found  # type: ignore[attr-defined]
    return found


#: PostgreSQL's answers to a role that may not read the server's identifier: permission
#: denied, or no such function (a server of PostgreSQL's protocol that has none).
_NOT_READABLE = frozenset({"42501", "42883"})


def _sqlstate(err: JobcoordError) -> str | None:
    """The SQLSTATE of the driver error behind `err` (the store raises its errors from it)."""
    cause = err.__cause__
    return getattr(getattr(cause, "orig", cause), "sqlstate", None)


def sqlite_identity(path: str) -> str:
    """A SQLite database file's name to a store (whether or not the file is there yet)."""
    return "sqlite:" + os.path.realpath(path)


def _user_file(store: ObjectStore, identity: str) -> str:
    name = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(store.root, USERS_DIR, name + ".json")


def record_user(store: ObjectStore, identity: str) -> str:
    """Record `db` as a user of the store (once; its file then stays). Called before a row
    naming an object of the store commits (under the gc lock held shared), so a gc that
    could delete that object sees this database first. `identity`: database_identity.
    Returns the record's path."""
    path = _user_file(store, identity)
    if os.path.isfile(path):
        return path
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{secrets.token_hex(8)}.tmp")
    try:
        if mkdir_once(directory):
            fsync_dir(store.root)
        # Written whole under a temporary name, then linked to its own: a record is never
        # seen half-written.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps({"database": identity}).encode("utf-8",
                                                                   "surrogateescape"))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # recorded meanwhile by another process
            os.link(tmp, path)
        fsync_dir(directory)
    except OSError as exc:
        raise store_error(exc, store.root, "recording the database that uses it") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


def refuse_broken_lock(store: ObjectStore) -> None:
    """Before a stage stores its bytes: a `gc.lock` that is not a regular file (a directory,
    a link, which is never followed) is refused now, exit 6, as the lock would be once the
    object was stored, leaving it there with no row (and gc, refused the same lock, never
    collected it). Opened as the stage's lock opens it, so a regular file it cannot open
    (no write access, the immutable flag) is refused now too."""
    path = os.path.join(store.root, LOCK_FILE)
    try:
        os.close(open_regular(path, os.O_RDWR | os.O_NOFOLLOW))
    except FileNotFoundError:
        return  # made by the stage's lock
    except OSError as exc:
        raise store_error(exc, store.root, f"opening its gc lock {path!r}") from None


def refuse_a_backups_directory(root: str, doing: str) -> None:
    """A backup's artifact directory (its manifest beside its `objects/`), or one inside
    it, is never used as a store (a backup's own directory taken for the live store, a
    mistyped --artifacts): made a live store, its database recorded there, gc deleted the
    backup's objects its database no longer named, and the backup no longer restored.
    Looked for along the path as given and along the one its links lead to (a link to the
    backup's directory is that directory); only a manifest a backup writes marks one."""
    seen = set()
    for start in (os.path.abspath(root), os.path.realpath(root)):
        path = start
        while path not in seen:
            seen.add(path)
            if _a_backup_manifest(os.path.join(path, MANIFEST),
                                  os.path.isdir(os.path.join(path, "objects"))):
                raise InvalidInput(
                    "invalid_input", f"the artifact store {root} is "
                    f"{'' if path == start else 'inside '}a backup's artifact directory "
                    f"({path} holds its manifest), never {doing}: used as a store, gc would "
                    "delete the backup's objects. Name the store with --artifacts. Nothing "
                    "was changed.", store=root, backup_directory=path)
            if os.path.dirname(path) == path:
                break
            path = os.path.dirname(path)


def _a_backup_manifest(path: str, beside_objects: bool) -> bool:
    """Whether `path` is a manifest a backup writes (a JSON object of a whole `format`,
    `rows` and an `objects` object), not some other tool's `manifest.json` (a web or
    extension tree): those stores are no backup's. `beside_objects`: an `objects/`
    directory is beside it; a backup of no object writes its manifest alone. One beside
    `objects/` that cannot be read or parsed may be a backup's (damaged), and is taken for
    one (a fifo, a directory or a link to nothing in its place too: taken for none, a
    stage made the directory a live store and gc deleted the backup's objects): refused,
    it can be looked at."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        # A link to nothing in its place is a manifest that cannot be read.
        return beside_objects and os.path.islink(path)
    except OSError:  # a fifo, a directory, unreadable: one that cannot be read
        return beside_objects
    try:
        with open(fd, "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError, RecursionError):
        return beside_objects
    return (isinstance(manifest, dict)
            and all(isinstance(manifest.get(k), int) and not isinstance(manifest.get(k), bool)
                    for k in ("format", "rows"))
            and isinstance(manifest.get("objects"), dict)
            and (beside_objects or not manifest["objects"]))


def is_user(store: ObjectStore, identity: str) -> bool:
    """Whether the store records the database of `identity` (database_identity) as a user."""
    return os.path.isfile(_user_file(store, identity))


def not_its_store(db: Database, store: ObjectStore, *, missing: bool = True
                  ) -> InvalidInput | None:
    """Objects of this database's rows looked for in `store`: the error to raise when the
    store is not this database's, None when it is. No store there (a mistyped --artifacts,
    or the store moved), or, when objects were found `missing`, a store that records other
    databases as its users and not this one (every stage records it before its row):
    another database's.
    Judged missing (exit 7, a damaged store) or failing an attempt, it was only the path:
    `artifact_store_missing` (exit 2)."""
    if not store.present():
        return InvalidInput(
            "artifact_store_missing",
            f"no artifact store at {store.root}, yet this database's artifacts are kept "
            "there: is --artifacts mistyped, or the store moved? Nothing was changed.",
            store=store.root)
    # Objects looked for through a store whose layout is broken are not missing: exit 6.
    store.refuse_broken_layout(tmp=False)
    if missing and not os.path.lexists(store.objects_dir):
        # Objects found missing through an `objects/` without its `sha256/`: no object
        # named by a row was ever kept anywhere else, so `objects/` is the empty mount
        # point of a volume not mounted (or the store was emptied by hand), not objects
        # lost one by one. (A transfer, and a completion, look without `missing`: an
        # empty `objects/` is how a store lost for good is made again.)
        raise StorageUnavailable(
            "artifact_store_unavailable", f"artifact store {store.root!r} cannot be used: "
            f"{store.objects_dir} is not there, yet this database's artifacts are kept "
            "there: is the volume that holds objects/ not mounted? Nothing was changed.",
            root=store.root)
    # A store recording no database at all was written before the records were kept:
    # taken as this database's, its missing objects stay missing.
    if missing and not is_user(store, database_identity(db)) and store_users(store):
        return InvalidInput(
            "artifact_store_missing",
            f"the artifact store at {store.root} is not this database's (it records no use "
            "by it): is --artifacts mistyped? Nothing was changed.", store=store.root)
    return None


def refuse_if_not_its_store(db: Database, store: ObjectStore, *, missing: bool = True,
                            found: JobcoordError | None = None, **details: Any) -> None:
    """Raise `not_its_store`'s error, if any, with `details` added (the job's id): where
    this database's objects are looked for through a store not its own, only the path was
    wrong, never the objects lost or the attempt at fault. `found`: the error a read of an
    object raised; looked at only when it says the object is missing."""
    if found is not None and found.code != "artifact_missing":
        return
    try:
        wrong = not_its_store(db, store, missing=missing)
    except JobcoordError as e:  # a store that cannot be used (exit 6) names the job too
        e.details = {**details, **e.details}
        raise
    if wrong is not None:
        raise InvalidInput(wrong.code, wrong.message, **details, **wrong.details) from None


def another_databases(db: Database, store: ObjectStore, named: Callable[[], Iterable[str]]
                      ) -> InvalidInput | None:
    """A store there that records other databases as its users and not this one, and holds
    none of the objects this database's rows name (`named()`, read only then: some of
    them, looked for): the error to raise, another database's store (a mistyped
    --artifacts). None otherwise: a store holding its objects is its own, however its
    records spell the database (a file moved with its store, a PostgreSQL database restored
    under another name); one naming no object may join a store another uses (shared on
    purpose)."""
    if is_user(store, database_identity(db)) or not store_users(store):
        return None
    looked = 0
    for digest in itertools.islice(named(), OBJECTS_LOOKED_FOR):
        try:
            if store.exists(digest):
                return None
        except InvalidInput:  # a digest changed by hand names no object: `check` says so
            continue
        looked += 1
    if not looked:
        return None
    return InvalidInput(
        "artifact_store_missing",
        f"the artifact store at {store.root} is another database's: it records other "
        f"databases, not this one, and holds none of this database's objects ({looked} "
        "looked for): is --artifacts mistyped? Nothing was changed.", store=store.root)


def store_users(store: ObjectStore) -> dict[str, str]:
    """{record path: the database it names} of every database recorded as using the store.
    A record that cannot be read names an unknown database (it is never taken for this
    one)."""
    directory = os.path.join(store.root, USERS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    except OSError as exc:  # not a directory: records that cannot be read are not none
        raise store_error(exc, store.root, "listing the databases that use it") from None
    found = {}
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            with open(fd, "rb") as f:
                found[path] = str(json.loads(f.read(65536))["database"])
        except (OSError, ValueError, KeyError, TypeError):
            found[path] = "(an unreadable record)"
    return found


def refuse_if_shared(store: ObjectStore, db: Database) -> None:
    """gc decides from this database's rows alone which objects nobody references: in a
    store another database uses, that would delete the objects only the other's rows
    reference (accepted artifacts included). Refused, `artifact_store_shared` (exit 4),
    nothing changed."""
    identity = database_identity(db)
    own = _user_file(store, identity)
    # This database's own record by its name and its contents: a damaged one names an
    # unknown database, as under any other name.
    others = {p: d for p, d in store_users(store).items() if p != own or d != identity}
    if others:
        path, other = next(iter(others.items()))
        raise Refused(
            "artifact_store_shared",
            f"the artifact store {store.root} is also used by {len(others)} other "
            f"database(s) ({other}, recorded in {path}): gc from one database would delete "
            "the objects only another's rows reference. Nothing was changed. Give each "
            "database a store of its own (restore with --artifacts naming a new directory); "
            "a record of a database that no longer uses this store may be removed by hand, "
            "then gc runs", store=store.root, databases=sorted(others.values()))

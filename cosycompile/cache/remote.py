"""Remote tier of the cache: an action cache plus content-addressed blobs on any fsspec filesystem.

Layout under the remote URL (the layout of Bazel's remote cache and DVC)::

    <url>/ac/<key>.json            # the local entry.json body: files -> [size, sha256], step, meta
    <url>/cas/<sha[:2]>/<sha256>   # each file's bytes, named by their digest

URLs are whatever fsspec opens: ``s3://bucket/prefix`` (s3fs; credentials and the endpoint come
from the usual AWS environment and config files: ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an S3-compatible server), ``gs://...``,
``file:///path`` or an absolute path. A value is parsed before anything is opened
(:func:`parse_url`): a mistyped URL (``s3:/team/cc``, ``s3://``, an unknown scheme) is an error,
never a local folder of that name.

Every network call has a deadline: each request has connect and read timeouts and few retries
(botocore's config), and each remote operation (one lookup, the pull of one entry, the push of one
entry) has a wall-clock budget, :data:`BUDGET_S` (or ``$COSYCOMPILE_REMOTE_BUDGET_S``) plus the
time its bytes take at :data:`MIN_RATE`, enforced by cancelling the call. A server that accepts
connections and never answers therefore costs one budget, and the executor drops the remote after
its first failure.

Write order keeps the remote consistent without locks: a push uploads every blob first and the
action entry last, with a conditional create (``If-None-Match: *``) so the first writer of a key
wins and is never overwritten; an action entry therefore only ever names blobs that were already
there. A pull downloads the blobs into a local staging dir, checks each one's size and sha256, and
commits through :class:`Store` like a step that ran here, so a pulled entry is as trustworthy as a
built one. Keys hash a step's inputs, so the remote is trusted to map a key to a correct output
(as with any shared build cache); verification guards against corruption, not against writers.
Claims (:mod:`cosycompile.cache.claims`, under ``<url>/claims/``) only save work: machines that miss
the same key at once build it once; correctness never depends on them.

Nothing here imports fsspec until a remote call is made: a fully cached build never touches it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from cosycompile.cache.local import ENTRY_VERSION, Store
from cosycompile.core.store import Entry
from cosycompile.core.hashing import sha256_file
from cosycompile.errors import UserError

ENV_VAR = "COSYCOMPILE_CACHE_REMOTE"
_SHA = re.compile(r"[0-9a-f]{64}")
_CLAIM = re.compile(r"\d{8}\.json")  # cache.claims names each generation so

# Per request (botocore): a connection must open within CONNECT_TIMEOUT_S and every socket read must
# return within READ_TIMEOUT_S; a stalled transfer is given up then, not after botocore's 60 s.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 15
MAX_ATTEMPTS = 2
# Per operation (wall clock): BUDGET_S for the requests themselves, plus the bytes it moves at
# MIN_RATE, so a big blob on a slow link still gets through while a silent server costs BUDGET_S.
# $BUDGET_ENV sets another budget: shorter for a remote on the same network, longer for a far one.
BUDGET_S = 30.0
BUDGET_ENV = "COSYCOMPILE_REMOTE_BUDGET_S"
BUDGET_RANGE = (1.0, 3600.0)
MIN_RATE = 1 << 20  # bytes per second
SCHEMES = ("s3", "s3a", "gs", "gcs", "file")  # what parse_url accepts before "://"
_BUCKET = {"s3": re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"),
           "gs": re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")}
_URL_MAX = 1024
# Fields of entry.json the local Store writes itself on commit.
_STORE_FIELDS = ("version", "key", "created", "files")


class RemoteError(Exception):
    """The remote cache could not be used (unreachable, refused, misconfigured)."""


class RemoteURLError(UserError):
    """A remote cache value that does not parse as a URL the remote tier can open (exit 2)."""


class RemoteCorrupt(RemoteError):
    """A remote entry that is malformed or whose blobs do not match their digests."""

    remote_usable = True  # the executor skips this entry but keeps using the remote


@dataclass
class PushResult:
    """What one push did: blobs uploaded or found, and whether our action entry was published."""

    key: str
    uploaded: int = 0
    present: int = 0
    bytes: int = 0
    published: bool = False  # False: an entry for the key was already there (first writer wins)


def remote_from(url: str | None) -> "RemoteCache | None":
    """The remote named by ``url`` (``--cache-remote``), else by ``$COSYCOMPILE_CACHE_REMOTE``;
    None when neither is set or the value is empty (an empty flag switches an env remote off).
    A value that is not a URL the remote tier can open is a :class:`RemoteURLError`."""
    where = f"${ENV_VAR}" if url is None else "--cache-remote"
    value = os.environ.get(ENV_VAR, "") if url is None else url
    return RemoteCache(value, where=where) if value.strip() else None


def seconds_from_env(var: str, default: float, bounds: tuple[float, float], what: str) -> float:
    """``$var`` as seconds, else ``default``; a value that is not a number within ``bounds`` is a
    UserError that says it should give ``what`` ("the seconds ...")."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    low, high = bounds
    if not low <= value <= high:  # also false for nan
        raise UserError(f"${var}={text[:40]!r}: give {what}, {low:.0f} to {high:.0f} (default {default:.0f})")
    return value


def budget_from_env() -> float:
    """Seconds one remote operation may take before its bytes: ``$COSYCOMPILE_REMOTE_BUDGET_S``, else
    :data:`BUDGET_S`. A value that is not a number of seconds in :data:`BUDGET_RANGE` is a UserError."""
    return seconds_from_env(BUDGET_ENV, BUDGET_S, BUDGET_RANGE, "the seconds one remote operation may take")


def parse_url(value: str, where: str = "remote cache URL") -> str:
    """``value`` checked as a remote cache URL and returned without surrounding blanks or a trailing ``/``.

    Accepted: ``s3://BUCKET[/PREFIX]`` (also ``s3a://``), ``gs://BUCKET[/PREFIX]`` (also
    ``gcs://``), ``file:///ABSOLUTE/PATH`` and an absolute path. Anything else is refused with a
    :class:`RemoteURLError` naming ``where``: fsspec would open ``s3:/team/cc`` or ``s3//b`` as a
    relative local folder and report a push into it as a success.
    """
    text = value.strip()
    shown = repr(text[:80] + ("..." if len(text) > 80 else ""))

    def bad(why: str) -> RemoteURLError:
        return RemoteURLError(f"{where} {shown}: {why}")

    if not text:
        raise bad("empty (give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///PATH)")
    if len(text) > _URL_MAX:
        raise bad(f"longer than {_URL_MAX} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise bad("holds a control character")
    if "://" not in text:
        if text.startswith("/"):
            return _check_path(text.rstrip("/") or "/", bad)
        scheme = text.split(":", 1)[0] if ":" in text else ""
        if scheme.lower() == "file":
            raise bad("not a URL: write file:///PATH (three slashes after the colon)")
        if scheme.lower() in SCHEMES:
            raise bad(f"not a URL: write {scheme}://BUCKET/PREFIX (two slashes after the colon)")
        raise bad("not a URL: give s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///PATH or an absolute path "
                  "(a relative path is refused: it would name a different folder in every working directory)")
    scheme, rest = text.split("://", 1)
    if scheme not in SCHEMES:
        raise bad(f"unknown scheme '{scheme}' (known: {', '.join(s + '://' for s in SCHEMES)})")
    if any(c in rest for c in "?#\\"):
        raise bad("holds '?', '#' or '\\' (not part of a bucket or folder name)")
    if scheme == "file":
        if not rest.startswith("/"):
            raise bad("a file URL needs an absolute path: file:///PATH (three slashes)")
        _check_path(rest.rstrip("/") or "/", bad)
        return f"file://{rest.rstrip('/') or '/'}"
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise bad(f"names no bucket: write {scheme}://BUCKET/PREFIX")
    if not _BUCKET["gs" if scheme in ("gs", "gcs") else "s3"].fullmatch(bucket) or ".." in bucket:
        raise bad(f"'{bucket}' is not a valid bucket name (3-63 lower-case letters, digits, '-' and '.')")
    parts = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if any(p in ("", ".", "..") for p in parts):
        raise bad("the prefix has an empty, '.' or '..' part")
    return f"{scheme}://{bucket}" + (f"/{'/'.join(parts)}" if parts else "")


def _check_path(path: str, bad: Any) -> str:
    """An absolute local path without ``.`` or ``..`` parts (a plain, predictable folder)."""
    if any(p in (".", "..") for p in path.split("/")):
        raise bad("the path has a '.' or '..' part")
    return path


class RemoteCache:
    """A shared cache tier over an fsspec filesystem (see the module docstring for the layout)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, where: str = "remote cache URL",
                 budget_s: float | None = None) -> None:
        self.url = parse_url(url, where)
        self.storage_options = dict(storage_options or {})
        self.budget_s = budget_from_env() if budget_s is None else float(budget_s)
        # Read here, with the budget, so that a bad value is refused before any work, not when the
        # first claim is made (where a remote failure is only a warning).
        from cosycompile.cache.claims import ttl_from_env

        self.claim_ttl_s = ttl_from_env()
        self._fs: Any = None
        self._root = ""
        self._deadline: float | None = None  # monotonic end of the operation under way, if any

    def __repr__(self) -> str:
        return f"RemoteCache({self.url!r})"

    # -- filesystem ----------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The fsspec filesystem, opened on first use (so a cached build never imports fsspec)."""
        return self._open()[0]

    def _open(self) -> tuple[Any, str]:
        """(filesystem, root path inside it), opening the filesystem the first time."""
        if self._fs is None:
            try:
                from fsspec.core import url_to_fs

                fs, root = url_to_fs(self.url, **self._options())
            except ImportError as exc:
                raise RemoteError(f"cannot open {self.url}: {exc} (s3:// needs s3fs: "
                                  "pip install 'cosycompile[remote]')") from None
            except Exception as exc:
                raise RemoteError(f"cannot open {self.url}: {_describe(exc)}") from exc
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs, self._root

    def _options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"skip_instance_cache": True}
        if self.url.startswith(("s3://", "s3a://")):
            # Fail fast when the server is down or silent: the build goes on locally after one
            # warning, so minutes of retries would only delay it. The AWS env retry settings still
            # take precedence; the operation's wall-clock budget (_call) bounds them all the same.
            config: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S}
            if "AWS_MAX_ATTEMPTS" not in os.environ and "AWS_RETRY_MODE" not in os.environ:
                config["retries"] = {"max_attempts": MAX_ATTEMPTS, "mode": "standard"}
            opts["config_kwargs"] = config
        opts.update(self.storage_options)
        return opts

    def _ac(self, key: str) -> str:
        return f"{self._open()[1]}/ac/{key}.json"

    def _cas(self, sha: str) -> str:
        return f"{self._open()[1]}/cas/{sha[:2]}/{sha}"

    @property
    def _local(self) -> bool:
        return bool(getattr(self.fs, "local_file", False))

    # -- read ----------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether the remote holds an action entry for ``key`` (its blobs are checked on pull)."""
        with self._operation():
            return bool(self._call(self.fs.exists, self._ac(key)))

    def read_entry(self, key: str) -> dict[str, Any] | None:
        """The action entry of ``key``, checked for shape, or None if the remote has none."""
        try:
            with self._operation():
                raw = self._call(self.fs.cat_file, self._ac(key))
        except FileNotFoundError:
            return None
        try:
            body = json.loads(raw)
        except ValueError:
            raise RemoteCorrupt(f"ac/{key[:12]}.json is not JSON") from None
        _check_entry(key, body)
        return body

    def pull(self, store: Store, key: str) -> Entry | None:
        """Download ``key``'s entry into ``store``, verifying every blob; None if the remote has none.

        Call while holding ``store.lock(key)``. A blob that is missing or does not match its digest
        raises :class:`RemoteCorrupt` and nothing is committed; a mismatching blob is deleted from
        the remote (its content is not what its name says, so no entry can need it), which lets the
        next push of the key upload it again.
        """
        with self._operation():
            body = self.read_entry(key)
            if body is None:
                return None
            self._extend(sum(size for size, _ in body["files"].values()))
            return self._download(store, key, body)

    def _download(self, store: Store, key: str, body: dict[str, Any]) -> Entry:
        """Fetch and verify the blobs of ``body`` into a staging dir and commit it (see :meth:`pull`)."""
        with store.staging(key) as stage:
            data = stage / "data"
            for rel, (size, sha) in sorted(body["files"].items()):
                dest = data / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    self._call(self.fs.get_file, self._cas(sha), str(dest))
                except FileNotFoundError:
                    raise RemoteCorrupt(f"entry {key[:12]}: blob of {rel} is missing") from None
                got_size = dest.stat().st_size
                got_sha = sha256_file(dest)
                if got_size != size or got_sha != sha:
                    self._drop_bad_blob(sha)
                    raise RemoteCorrupt(f"entry {key[:12]}: {rel} does not match its digest "
                                        f"({got_size} bytes, sha256 {got_sha[:12]}; expected {size}, {sha[:12]})")
            meta = {k: v for k, v in body.items() if k not in _STORE_FIELDS}
            meta["pulled"] = {"from": self.url, "at": time.time()}
            return store.commit(key, stage, meta)

    def _drop_bad_blob(self, sha: str) -> None:
        try:
            self._call(self.fs.rm_file, self._cas(sha))
        except Exception:
            pass  # best effort: pulls verify anyway, and a read-only remote is still usable

    # -- write ---------------------------------------------------------------------------
    def push(self, store: Store, entry: Entry) -> PushResult:
        """Upload ``entry``'s blobs that the remote lacks, then publish its action entry unless one exists.

        Blobs go first, so an action entry never names a blob that is not there; a push cut off
        half-way leaves only blobs, which a later push reuses.
        """
        files: dict[str, list[Any]] = entry.meta["files"]
        with self._operation(sum(size for size, _ in files.values())):
            return self._upload(entry, files)

    def _upload(self, entry: Entry, files: dict[str, list[Any]]) -> PushResult:
        """Upload the missing blobs of ``entry``, then create its action entry (see :meth:`push`)."""
        res = PushResult(entry.key)
        for rel, (size, sha) in sorted(files.items()):
            if self._blob_size(sha) == size:
                res.present += 1
                continue
            self._put_blob(entry.data / rel, sha)
            res.uploaded += 1
            res.bytes += size
        body = json.dumps(entry.meta, indent=1, sort_keys=True).encode()
        res.published = self._create(self._ac(entry.key), body)
        return res

    def _blob_size(self, sha: str) -> int | None:
        try:
            return int(self._call(self.fs.info, self._cas(sha))["size"])
        except FileNotFoundError:
            return None

    def _put_blob(self, src: Path, sha: str) -> None:
        dest = self._cas(sha)
        if self._local:
            # A local filesystem copies in place: write beside, then rename, so readers never see
            # a partial blob. (An S3 PUT only becomes visible once complete.)
            self.fs.makedirs(self.fs._parent(dest), exist_ok=True)
            tmp = f"{dest}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            self.fs.put_file(str(src), tmp)
            os.replace(tmp, dest)
            return
        self._call(self.fs.put_file, str(src), dest)

    def _create(self, path: str, data: bytes) -> bool:
        """Write ``path`` only if it does not exist; False when it does (someone else wrote it first)."""
        if self._local:
            self.fs.makedirs(self.fs._parent(path), exist_ok=True)
            tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            Path(tmp).write_bytes(data)
            try:
                os.link(tmp, path)  # atomic create-if-absent
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            return True
        try:
            self._call(self.fs.pipe_file, path, data, mode="create")
        except Exception as exc:
            if _already_exists(exc):
                return False
            raise
        return True

    # -- small objects beside the cache (claims) ------------------------------------------
    def _path(self, rel: str) -> str:
        return f"{self._open()[1]}/{rel}"

    def create_object(self, rel: str, data: bytes) -> bool:
        """Write ``rel`` (a path under the remote's root) only if absent; False when it exists."""
        with self._operation():
            return self._create(self._path(rel), data)

    def put_object(self, rel: str, data: bytes) -> None:
        """Write ``rel`` whole, replacing what is there (readers see the old or the new bytes)."""
        path = self._path(rel)
        with self._operation():
            if self._local:
                self.fs.makedirs(self.fs._parent(path), exist_ok=True)
                tmp = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
                Path(tmp).write_bytes(data)
                os.replace(tmp, path)
                return
            self._call(self.fs.pipe_file, path, data)

    def read_object(self, rel: str) -> bytes | None:
        """The bytes of ``rel``, or None if it does not exist."""
        with self._operation():
            try:
                return bytes(self._call(self.fs.cat_file, self._path(rel)))
            except FileNotFoundError:
                return None

    def list_folder(self, rel: str) -> dict[str, float]:
        """Name -> last modified (epoch seconds) of every object in folder ``rel``, read afresh
        (not from fsspec's listing cache); empty if there is none."""
        path = self._path(rel)
        with self._operation():
            try:
                found = self._call(self.fs.ls, path, detail=True, refresh=True)
            except FileNotFoundError:
                return {}
        return {PurePosixPath(info["name"]).name: _modified(info) for info in found
                if info.get("type") != "directory" and ".tmp." not in PurePosixPath(info["name"]).name}

    def remove_object(self, rel: str) -> None:
        """Delete ``rel``; nothing happens if it is gone already."""
        with self._operation():
            try:
                self._call(self.fs.rm_file, self._path(rel))
            except FileNotFoundError:
                pass

    def claim(self, store: Store, key: str, step: str, waiting: Any) -> Any:
        """Hold the right to build ``key``, or wait until another machine has built it (see
        :mod:`cosycompile.cache.claims`): a :class:`~cosycompile.cache.claims.Claim` to release after
        the push, or None once the entry is pulled into ``store``."""
        from cosycompile.cache.claims import acquire

        return acquire(self, store, key, step, waiting)

    # -- listing and removal (cache gc) --------------------------------------------------
    def listing(self, kind: str) -> dict[str, tuple[int, float]]:
        """Every object under ``ac/`` (named by key), ``cas/`` (by sha256) or ``claims/`` (by
        ``KEY/GENERATION.json``): name -> (bytes, last modified, seconds since the epoch). Other names
        (a local push's temporaries) are skipped."""
        assert kind in ("ac", "cas", "claims")
        with self._operation():
            try:
                found = self._call(self.fs.find, f"{self._open()[1]}/{kind}", detail=True)
            except FileNotFoundError:
                return {}
        out: dict[str, tuple[int, float]] = {}
        for path, info in found.items():
            pure = PurePosixPath(path)
            if kind == "claims":
                if _SHA.fullmatch(pure.parent.name) and _CLAIM.fullmatch(pure.name):
                    out[f"{pure.parent.name}/{pure.name}"] = (int(info.get("size") or 0), _modified(info))
                continue
            name = pure.name[:-5] if kind == "ac" and pure.name.endswith(".json") else pure.name
            if _SHA.fullmatch(name):
                out[name] = (int(info.get("size") or 0), _modified(info))
        return out

    def remove(self, kind: str, name: str) -> None:
        """Delete the action entry of key ``name`` (``kind`` "ac"), the blob ``name`` ("cas") or the
        claim ``name`` ("claims", as :meth:`listing` names it)."""
        path = {"ac": self._ac, "cas": self._cas, "claims": lambda n: self._path(f"claims/{n}")}[kind](name)
        with self._operation():
            try:
                self._call(self.fs.rm_file, path)
            except FileNotFoundError:
                pass  # another collector was first

    # -- deadlines -----------------------------------------------------------------------
    @contextmanager
    def _operation(self, nbytes: int = 0) -> Iterator[None]:
        """Give the remote operation started here a wall-clock budget of ``budget_s`` plus ``nbytes``
        at :data:`MIN_RATE`; an operation nested in another one shares the outer budget."""
        if self._deadline is not None:
            self._extend(nbytes)
            yield
            return
        self._started = time.monotonic()
        self._deadline = self._started + self.budget_s + nbytes / MIN_RATE
        try:
            yield
        finally:
            self._deadline = None

    def _extend(self, nbytes: int) -> None:
        """Add the time ``nbytes`` take at :data:`MIN_RATE` to the operation under way."""
        if self._deadline is not None:
            self._deadline += max(nbytes, 0) / MIN_RATE

    def _timed_out(self) -> RemoteError:
        spent = time.monotonic() - getattr(self, "_started", time.monotonic())
        return RemoteError(f"no answer within {spent:.0f} s (the deadline of one remote operation: "
                           f"{self.budget_s:.0f} s plus 1 s per MiB moved)")

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one filesystem call within the operation's deadline; a missing file stays
        FileNotFoundError, an existing one stays as raised (for :meth:`_create`), a call past the
        deadline and anything else is a :class:`RemoteError`.

        An async filesystem (s3fs, gcsfs) gets the time left as fsspec's ``timeout``, which cancels
        the request and its retries when it runs out; a local one cannot hang on the network.
        """
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out()
            if getattr(self._fs, "async_impl", False):
                kwargs["timeout"] = max(left, 0.05)  # fsspec reads 0 as "no timeout"
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except (TimeoutError, asyncio.TimeoutError):  # fsspec's FSTimeoutError is one
            raise self._timed_out() from None
        except Exception as exc:
            if _already_exists(exc):
                raise
            raise RemoteError(_describe(exc)) from exc


def _modified(info: dict[str, Any]) -> float:
    """An fsspec listing's last-modified time as epoch seconds (local: ``mtime``; S3: ``LastModified``)."""
    value = info.get("LastModified", info.get("mtime", info.get("created")))
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value) if isinstance(value, (int, float)) else 0.0


def _check_entry(key: str, body: Any) -> None:
    """Refuse an action entry that is not for ``key`` or names unsafe paths or bad digests."""
    if not isinstance(body, dict) or body.get("key") != key or body.get("version") != ENTRY_VERSION:
        raise RemoteCorrupt(f"ac/{key[:12]}.json does not describe key {key[:12]} (version {ENTRY_VERSION})")
    files = body.get("files")
    if not isinstance(files, dict):
        raise RemoteCorrupt(f"ac/{key[:12]}.json has no file list")
    for rel, val in files.items():
        ok_val = (isinstance(val, list) and len(val) == 2 and isinstance(val[0], int) and val[0] >= 0
                  and isinstance(val[1], str) and _SHA.fullmatch(val[1]) is not None)
        if not ok_val or not _safe_rel(rel):
            raise RemoteCorrupt(f"ac/{key[:12]}.json: bad file record {rel!r}")


def _safe_rel(rel: Any) -> bool:
    """A relative POSIX path that stays inside the entry's data dir."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel:
        return False
    parts = PurePosixPath(rel).parts
    return all(p not in ("", ".", "..") for p in parts)


def _already_exists(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is a refused conditional create: HTTP 412 Precondition Failed,
    or 409 ConditionalRequestConflict (a concurrent conditional write of the same key)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, FileExistsError):
            return True
        resp = getattr(cur, "response", None)
        if isinstance(resp, dict):
            code = resp.get("Error", {}).get("Code")
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__

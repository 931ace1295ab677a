"""The cold store: the one place that knows whether archived data lives on a local folder
(``file://``, the default under ``DATA_DIR/tier``) or an S3-compatible object store
(``s3://bucket/prefix`` through s3fs with endpoint, region and credentials).

Everything else speaks in store-relative keys (``topics/t/partition=0/0-99.parquet``) and calls
the few operations here: whole-object writes that become visible only once complete
(:meth:`ColdStore.put_atomic`, :meth:`ColdStore.create_exclusive`), reads, listings, deletes.
A :class:`StoreSpec` is a small picklable description, so Spark executors rebuild the store
from it and need nothing of the broker's disk.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

COPY_CHUNK_BYTES = 8 * 1024 * 1024


class AlreadyExistsError(Exception):
    """An exclusive create found the key already there (another writer won)."""


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """Where the cold store is and how to reach it; picklable, no secrets in ``repr``."""

    url: str
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = field(default=None, repr=False)
    s3_secret_access_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Any) -> StoreSpec:
        url = settings.tier_store_url or (settings.data_dir / "tier").resolve().as_uri()
        return cls(
            url=str(url),
            s3_endpoint_url=settings.tier_s3_endpoint_url,
            s3_region=settings.tier_s3_region,
            s3_access_key_id=settings.tier_s3_access_key_id,
            s3_secret_access_key=settings.tier_s3_secret_access_key,
        )

    def open(self) -> ColdStore:
        return ColdStore(self)


class ColdStore:
    """Store-relative keys over an fsspec filesystem rooted at the spec's URL."""

    def __init__(self, spec: StoreSpec) -> None:
        self.spec = spec
        protocol, root = _split_url(spec.url)
        self.protocol = protocol
        self.local = protocol == "file"
        options: dict[str, Any] = {}
        if protocol == "s3":
            client_kwargs: dict[str, Any] = {}
            if spec.s3_endpoint_url:
                client_kwargs["endpoint_url"] = spec.s3_endpoint_url
            if spec.s3_region:
                client_kwargs["region_name"] = spec.s3_region
            options = {"client_kwargs": client_kwargs, "use_listings_cache": False}
            if spec.s3_access_key_id:
                options["key"] = spec.s3_access_key_id
                options["secret"] = spec.s3_secret_access_key
        elif protocol == "file":
            options = {"auto_mkdir": True}
        import fsspec  # here, not at import: the broker loads this module without tiering

        self.fs = fsspec.filesystem(protocol, **options)
        self.root = root.rstrip("/")
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"ColdStore({self.spec.url!r})"

    # -- keys -----------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """The filesystem path of ``key`` (for pyarrow, which takes path + filesystem)."""
        return posixpath.join(self.root, key) if key else self.root

    def url(self, key: str) -> str:
        """The full URL of ``key``, e.g. for ``spark.read.parquet``."""
        return f"{self.protocol}://{self.path(key)}"

    def _key(self, path: str) -> str:
        path = path.removeprefix(f"{self.protocol}://")
        return posixpath.relpath(path, self.root)

    # -- reads ----------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self.path(key)))

    def size(self, key: str) -> int:
        return int(self.fs.size(self.path(key)))

    def get(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(key)))

    def open_read(self, key: str) -> IO[bytes]:
        return self.fs.open(self.path(key), "rb")

    def list(self, prefix: str) -> list[str]:
        """Keys of the objects directly under ``prefix`` (a folder), sorted; [] if none."""
        return [key for key, _ in self.list_sizes(prefix)]

    def list_sizes(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of the objects directly under ``prefix``, sorted by key."""
        try:
            entries = self.fs.ls(self.path(prefix), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(
            (self._key(e["name"]), int(e.get("size") or 0))
            for e in entries
            if e.get("type") == "file" and not e["name"].endswith(".tmp")
        )

    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the folders directly under ``prefix``."""
        try:
            entries = self.fs.ls(self.path(prefix), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        names = (
            posixpath.basename(e["name"].rstrip("/"))
            for e in entries
            if e.get("type") == "directory"
        )
        return sorted(names)

    # -- writes ---------------------------------------------------------------------------
    def put_atomic(self, key: str, chunks: bytes | memoryview | Iterable[bytes]) -> int:
        """Write ``key`` so that readers see either nothing or the whole object: a temp file
        and a rename on file://, one PUT (or a multipart upload completed at close) on s3."""
        if isinstance(chunks, bytes | bytearray | memoryview):
            chunks = (chunks,)  # written as is: no copy of a large object
        target = self.path(key)
        if self.local:
            os.makedirs(posixpath.dirname(target), exist_ok=True)
            tmp = f"{target}.{uuid.uuid4().hex}.tmp"
            written = 0
            try:
                with open(tmp, "wb") as fh:
                    for chunk in chunks:
                        fh.write(chunk)
                        written += len(chunk)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(posixpath.dirname(target))
            return written
        written = 0
        with self.fs.open(target, "wb", block_size=COPY_CHUNK_BYTES) as fh:
            for chunk in chunks:
                fh.write(chunk)
                written += len(chunk)
        return written

    def create_exclusive(self, key: str, data: bytes) -> None:
        """Create ``key`` whole, failing with :class:`AlreadyExistsError` when it exists: a
        hard link of a complete temp file on file://, a conditional PUT
        (``If-None-Match: *``) on s3. The manifest's commit point."""
        target = self.path(key)
        if self.local:
            os.makedirs(posixpath.dirname(target), exist_ok=True)
            tmp = f"{target}.{uuid.uuid4().hex}.tmp"
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise AlreadyExistsError(key) from None
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            _fsync_dir(posixpath.dirname(target))
            return
        bucket, _, obj = target.partition("/")
        from botocore.exceptions import ClientError

        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=obj, Body=data, IfNoneMatch="*")
        except FileExistsError:  # s3fs's translation of 412 PreconditionFailed
            raise AlreadyExistsError(key) from None
        except ClientError as exc:  # pragma: no cover - depends on the server's wording
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                raise AlreadyExistsError(key) from None
            raise
        except OSError as exc:
            if "PreconditionFailed" in str(exc) or "412" in str(exc):
                raise AlreadyExistsError(key) from None
            raise
        self.fs.invalidate_cache()

    def move(self, src: str, dst: str) -> None:
        """Move a complete object to its final key (a rename on file://, copy+delete on s3)."""
        if self.local:
            target = self.path(dst)
            os.makedirs(posixpath.dirname(target), exist_ok=True)
            os.replace(self.path(src), target)
            _fsync_dir(posixpath.dirname(target))
            return
        self.fs.copy(self.path(src), self.path(dst))
        self.fs.rm(self.path(src))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(key))

    def delete_prefix(self, prefix: str) -> None:
        """Remove a folder and everything under it (nothing when it does not exist)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(prefix), recursive=True)
        if not self.local:
            self.fs.invalidate_cache()

    def ensure_root(self) -> None:
        """Create the bucket folder on file:// (s3 buckets are created by their owner)."""
        if self.local:
            os.makedirs(self.root, exist_ok=True)


def _split_url(url: str) -> tuple[str, str]:
    if "://" not in url:
        return "file", os.path.abspath(url)
    protocol, _, rest = url.partition("://")
    protocol = protocol.lower()
    if protocol == "file":
        return "file", os.path.abspath("/" + rest.lstrip("/"))
    if protocol in ("s3", "s3a"):
        return "s3", rest.strip("/")
    raise ValueError(f"tier.store.url must be file:// or s3://, not {url!r}")


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

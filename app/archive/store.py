"""The archive's files: `{root}/{kind}/date={day}/*.parquet`, a part per write and, once a day
is compacted, one `day.parquet` holding it.

A part is durable before it is visible: on a local disk it is written under a hidden name,
fsynced, renamed, and its folder fsynced; on an object store (s3://, gs://...) the object
appears only once whole. Readers skip hidden names, so a write killed half-way leaves nothing
they read, and a row written twice (a write whose acknowledgement was lost) is read once:
every read keeps each row's first copy (rows.unique_rows).

On a local disk the files are the archive's user's alone: folders 0700, files 0600. They hold
every user's ids and what each did, and everything that reads them (the retrain, the judge,
the archive's compaction) runs as that same user, so no group needs them; an operator reads
them as that user or as root. Folders made before are left as they are. On an object store
the bucket's policy decides.

Rows kept apart (quarantine.py) go to `{root}/quarantine/{kind}/date={day}/`, the day the
archive kept them by its own clock; no read of the archive's tables sees them.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from app.archive.quarantine import QUARANTINE_SCHEMA
from app.archive.rows import SCHEMAS, Kind, by_day, unique_rows

COMPACTED = "day.parquet"
QUARANTINE = "quarantine"
FOLDER_MODE = 0o700
FILE_MODE = 0o600


class ArchiveStore:
    def __init__(self, uri: str) -> None:
        if "://" in uri:
            self._fs, self._root = pafs.FileSystem.from_uri(uri)
            self._local = isinstance(self._fs, pafs.LocalFileSystem)
        else:
            self._fs, self._root = pafs.LocalFileSystem(), os.path.abspath(uri)
            self._local = True
        self.uri = uri

    def _day_dir(self, kind: Kind, day: str) -> str:
        return f"{self._root}/{kind.value}/date={day}"

    def write(self, kind: Kind, table: pa.Table) -> int:
        """The rows written, a part per day they fall on; bytes written. Raises OSError (and
        pyarrow's errors) when the store does not take them: nothing is then acknowledged."""
        written = 0
        for day, rows in by_day(table).items():
            name = f"part-{int(time.time() * 1000)}-{secrets.token_hex(4)}.parquet"
            written += self._put(self._day_dir(kind, day), name, rows)
        return written

    def write_quarantined(self, kind: Kind, table: pa.Table, day: str) -> int:
        """Rows kept apart (quarantine.QUARANTINE_SCHEMA), as one part of the day given."""
        folder = f"{self._root}/{QUARANTINE}/{kind.value}/date={day}"
        name = f"part-{int(time.time() * 1000)}-{secrets.token_hex(4)}.parquet"
        return self._put(folder, name, table)

    def quarantined(self, kind: Kind) -> pa.Table:
        """Every row of this kind kept apart, in the order kept."""
        selector = pafs.FileSelector(
            f"{self._root}/{QUARANTINE}/{kind.value}", allow_not_found=True, recursive=True
        )
        paths = sorted(
            info.path
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.File
            and info.base_name.endswith(".parquet")
            and not info.base_name.startswith(".")
        )
        schema = QUARANTINE_SCHEMA
        tables = [pq.read_table(path, filesystem=self._fs, schema=schema) for path in paths]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def _put(self, folder: str, name: str, table: pa.Table) -> int:
        if not self._local:
            self._fs.create_dir(folder, recursive=True)
            with self._fs.open_output_stream(f"{folder}/{name}") as out:
                pq.write_table(table, out, compression="zstd")
            return int(self._fs.get_file_info(f"{folder}/{name}").size)
        _private_folders(Path(folder))
        hidden = Path(folder) / f".{name}.tmp"
        try:
            # Made 0600 (the umask may take bits away, never add them); the rename keeps it.
            descriptor = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            with open(descriptor, "wb") as out:
                pq.write_table(table, out, compression="zstd")
                out.flush()
                os.fsync(out.fileno())
            os.replace(hidden, Path(folder) / name)
        finally:
            hidden.unlink(missing_ok=True)
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return (Path(folder) / name).stat().st_size

    def days(self, kind: Kind) -> list[str]:
        selector = pafs.FileSelector(f"{self._root}/{kind.value}", allow_not_found=True)
        found = [
            info.base_name.removeprefix("date=")
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory and info.base_name.startswith("date=")
        ]
        return sorted(found)

    def files(self, kind: Kind, day: str) -> list[str]:
        selector = pafs.FileSelector(self._day_dir(kind, day), allow_not_found=True)
        return sorted(
            info.path
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.File
            and info.base_name.endswith(".parquet")
            and not info.base_name.startswith(".")
        )

    def _read(self, kind: Kind, paths: list[str]) -> pa.Table:
        schema = SCHEMAS[kind]
        tables = [pq.read_table(path, filesystem=self._fs, schema=schema) for path in paths]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def read_day(self, kind: Kind, day: str) -> pa.Table:
        return unique_rows(self._read(kind, self.files(kind, day)), kind)

    def read(self, kind: Kind, first_day: str = "", last_day: str = "9999") -> pa.Table:
        """Every row of the days from first_day to last_day (inclusive), each once, by time.
        A compaction may remove parts between the listing and the reading: listed again."""
        for attempt in range(3):
            days = [day for day in self.days(kind) if first_day <= day <= last_day]
            paths = [path for day in days for path in self.files(kind, day)]
            try:
                return unique_rows(self._read(kind, paths), kind)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def compact(self, kind: Kind, day: str) -> tuple[int, int]:
        """The day's files merged into one, each row once: (files merged, rows kept). A
        compaction killed half-way leaves the parts (and maybe the new file beside them):
        reads stay right, and the next compaction finishes the job."""
        paths = self.files(kind, day)
        if len(paths) < 2 and all(path.endswith("/" + COMPACTED) for path in paths):
            return 0, 0
        table = unique_rows(self._read(kind, paths), kind)
        folder = self._day_dir(kind, day)
        staged = f"compacting-{secrets.token_hex(4)}.parquet"
        self._put(folder, staged, table)
        self._fs.move(f"{folder}/{staged}", f"{folder}/{COMPACTED}")
        for path in paths:
            if not path.endswith("/" + COMPACTED):
                self._fs.delete_file(path)
        return len(paths), table.num_rows


def _private_folders(folder: Path) -> None:
    """The folder and each missing one above it made 0700; those there already left alone."""
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        try:
            os.mkdir(each, FOLDER_MODE)
        except FileExistsError:  # made meanwhile (a compaction beside the archive)
            continue
        os.chmod(each, FOLDER_MODE)  # mkdir's mode went through the umask: 0700 whatever it is

"""The archive's files: `{root}/{kind}/date={day}/*.parquet`, a part per write and, once a day
is compacted, one `day.parquet` holding it.

A part is durable before it is visible: on a local disk it is written under a hidden name,
fsynced, renamed, and its folder fsynced; on an object store (s3://, gs://...) the object
appears only once whole. Readers skip hidden names, so a write killed half-way leaves nothing
they read, and a row written twice (a write whose acknowledgement was lost) is read once:
every read keeps each row's first copy (rows.unique_rows).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from app.archive.rows import SCHEMAS, Kind, by_day, unique_rows

COMPACTED = "day.parquet"


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

    def _put(self, folder: str, name: str, table: pa.Table) -> int:
        if not self._local:
            self._fs.create_dir(folder, recursive=True)
            with self._fs.open_output_stream(f"{folder}/{name}") as out:
                pq.write_table(table, out, compression="zstd")
            return int(self._fs.get_file_info(f"{folder}/{name}").size)
        Path(folder).mkdir(parents=True, exist_ok=True)
        hidden = Path(folder) / f".{name}.tmp"
        try:
            with open(hidden, "wb") as out:
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

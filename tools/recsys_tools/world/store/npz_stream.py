"""An .npz written array by array from chunks, and read back a slice at a time, so a table
larger than memory can be saved and loaded.

np.savez needs each array whole; this writes the same file (an uncompressed zip of .npy
members, read back by np.load as any other) from chunks that arrive in order, as a Spark
job's partitions do. Each member's shape and dtype are declared first and checked against
what arrived, so a short or long stream fails instead of writing a file np.load misreads.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError

# A zip member's local header before its name and extra field (PKZIP's fixed 30 bytes).
_LOCAL_HEADER = 30


class NpzStream:
    """`with NpzStream(path) as out: out.array("ids", dtype, (n,), chunks)`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def __enter__(self) -> NpzStream:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._zip.close()
        if kind is not None:
            self._path.unlink(missing_ok=True)

    def array(
        self,
        name: str,
        dtype: npt.DTypeLike,
        shape: tuple[int, ...],
        chunks: Iterable[npt.NDArray[np.generic]],
    ) -> None:
        wanted = np.dtype(dtype)
        header = {
            "descr": np.lib.format.dtype_to_descr(wanted),
            "fortran_order": False,
            "shape": shape,
        }
        expected = int(np.prod(shape)) * wanted.itemsize
        written = 0
        with self._zip.open(f"{name}.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(member, header)
            for chunk in chunks:
                data = np.ascontiguousarray(chunk, dtype=wanted).tobytes()
                written += len(data)
                if written > expected:
                    break
                member.write(data)
        if written != expected:
            raise ConfigError(
                f"{self._path.name}: {name} got {written:,} bytes for shape {shape} of "
                f"{wanted} ({expected:,} expected); the table changed while it was written"
            )


def mapped(path: Path) -> dict[str, npt.NDArray[np.generic]]:
    """Each member of an .npz as a read-only memory map (np.savez and NpzStream store them
    uncompressed), so a table larger than memory is read a slice at a time; a compressed
    member is read whole."""
    arrays: dict[str, npt.NDArray[np.generic]] = {}
    with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                with archive.open(info) as member:
                    arrays[name] = np.load(member)
                continue
            raw.seek(info.header_offset)
            local = raw.read(_LOCAL_HEADER)
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            raw.seek(info.header_offset + _LOCAL_HEADER + name_length + extra_length)
            version = np.lib.format.read_magic(raw)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(raw)
            if int(np.prod(shape)) == 0:
                arrays[name] = np.empty(shape, dtype=dtype)
                continue
            order: Literal["C", "F"] = "F" if fortran else "C"
            arrays[name] = np.memmap(path, dtype, "r", raw.tell(), shape, order)
    return arrays

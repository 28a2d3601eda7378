"""CSV reading with row locations, so a bad trace row is reported as `file:line: what is wrong`."""

from __future__ import annotations

import _csv
import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.core.errors import SpecError


@dataclass(frozen=True, slots=True)
class Row:
    """One CSV record and where it came from."""

    source: str
    line: int
    values: dict[str, str]

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def text(self, col: str, default: str | None = None) -> str:
        v = self.values.get(col)
        if v is None or v == "":
            if default is not None:
                return default
            raise SpecError(self.where, f"column {col!r} is empty")
        return v.strip()

    def _number(self, col: str, default: float | None, kind: str) -> float | None:
        raw = self.values.get(col)
        if raw is None or raw.strip() == "":
            if default is not None:
                return None
            raise SpecError(self.where, f"column {col!r} is empty")
        try:
            v = float(raw)
        except ValueError:
            raise SpecError(self.where, f"column {col!r} must be {kind}, got {raw!r}") from None
        if math.isnan(v) or math.isinf(v):
            raise SpecError(self.where, f"column {col!r} must be {kind}, got {raw!r}")
        return v

    def int(self, col: str, default: int | None = None, minimum: int | None = 0) -> int:
        f = self._number(col, default, "an integer")
        if f is None:
            assert default is not None
            return default
        if f != int(f):
            raise SpecError(self.where, f"column {col!r} must be an integer, got {self.values[col]!r}")
        v = int(f)
        if minimum is not None and v < minimum:
            raise SpecError(self.where, f"column {col!r} must be >= {minimum}, got {v}")
        return v

    def float(self, col: str, default: float | None = None, minimum: float | None = 0.0) -> float:
        v = self._number(col, default, "a finite number")
        if v is None:
            assert default is not None
            return default
        if minimum is not None and v < minimum:
            raise SpecError(self.where, f"column {col!r} must be >= {minimum:g}, got {v:g}")
        return v


def read_text(path: str | Path, what: str = "file") -> str:
    """A trace file's text; a missing or binary file is one located error, not an OSError or a
    UnicodeDecodeError that names no file."""
    p = Path(path)
    try:
        return p.read_text()
    except OSError as e:
        raise SpecError(str(p), f"cannot read {what}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SpecError(str(p), f"not a text file: expected a {what}") from None


def read_rows(path: str | Path, required: Sequence[str], delimiter: str = ",") -> Iterator[Row]:
    """Rows of a CSV file with a header; checks the required columns exist."""
    p = Path(path)
    try:
        fh = p.open(newline="")
    except OSError as e:
        raise SpecError(str(p), f"cannot read file: {e.strerror or e}") from None
    with fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            yield from _rows(p, reader, required)
        except UnicodeDecodeError:
            raise SpecError(
                str(p), f"not a text file: expected a CSV with columns {', '.join(required)}"
            ) from None
        except csv.Error as e:
            raise SpecError(f"{p}:{reader.line_num}", f"not a valid CSV: {e}") from None


def _rows(p: Path, reader: _csv.Reader, required: Sequence[str]) -> Iterator[Row]:
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise SpecError(f"{p}:1", "empty file: expected a header row") from None
    missing = [c for c in required if c not in header]
    if missing:
        raise SpecError(f"{p}:1", f"missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
    for values in reader:
        line = reader.line_num
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise SpecError(f"{p}:{line}", f"expected {len(header)} fields, got {len(values)}")
        yield Row(str(p), line, dict(zip(header, values, strict=True)))

"""CSV and JSON export of a recorded window (series, markers, phase summaries).

CSV is wide, one row per timestamp, for spreadsheets: ``t_ns, t_s, <series> [unit]..., markers``;
series sampled together share rows, a marker gets a row of its own at its time with its
``phase:edge`` in the last column. JSON keeps everything (NaN written as null) and reads back.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Marker, TelemetrySeries
from opscope.engine.telemetry.summary import PhaseSummary


def write_csv(path: Path | str, series: Sequence[TelemetrySeries], markers: Iterable[Marker] = ()) -> int:
    """Write the window; returns the number of data rows."""
    rows = _wide_rows(series, markers)
    with _open_for_writing(path) as f:
        w = csv.writer(f)
        w.writerow(["t_ns", "t_s", *(f"{s.name} [{s.unit}]" for s in series), "markers"])
        t0 = rows[0][0] if rows else 0
        for t, values, tags in rows:
            w.writerow([t, f"{(t - t0) / 1e9:.6f}", *(_cell(v) for v in values), ";".join(tags)])
    return len(rows)


def _wide_rows(
    series: Sequence[TelemetrySeries], markers: Iterable[Marker]
) -> list[tuple[int, list[float | None], list[str]]]:
    table: dict[int, tuple[list[float | None], list[str]]] = {}
    for col, s in enumerate(series):
        for t, v in zip(s.t_ns, s.values):
            table.setdefault(int(t), ([None] * len(series), []))[0][col] = v
    for m in markers:
        table.setdefault(int(m.t_ns), ([None] * len(series), []))[1].append(f"{m.phase}:{m.edge}")
    return [(t, *table[t]) for t in sorted(table)]


def _cell(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def to_json_dict(
    series: Sequence[TelemetrySeries], markers: Iterable[Marker] = (), phases: Iterable[PhaseSummary] = ()
) -> dict[str, Any]:
    return {
        "format": "opscope.telemetry/1",
        "series": [
            {
                "name": s.name,
                "unit": s.unit,
                "t_ns": [int(t) for t in s.t_ns],
                "values": [None if _nan(v) else v for v in s.values],
            }
            for s in series
        ],
        "markers": [{"phase": m.phase, "edge": m.edge, "t_ns": m.t_ns, "attrs": m.attrs} for m in markers],
        "phases": [p.as_dict() for p in phases],
    }


def write_json(
    path: Path | str,
    series: Sequence[TelemetrySeries],
    markers: Iterable[Marker] = (),
    phases: Iterable[PhaseSummary] = (),
) -> None:
    data = to_json_dict(series, markers, phases)
    with _open_for_writing(path) as f:
        # allow_nan=False: NaN became null above; anything left would be invalid JSON
        json.dump(data, f, allow_nan=False, default=str)


def read_json(path: Path | str) -> tuple[list[TelemetrySeries], list[Marker]]:
    """Series and markers of a file written by write_json (phase summaries are recomputed)."""
    try:
        data = json.loads(Path(path).read_text())
        series = [
            TelemetrySeries(
                s["name"], s["unit"], list(s["t_ns"]), [math.nan if v is None else float(v) for v in s["values"]]
            )
            for s in data["series"]
        ]
        marks = [Marker(m["phase"], m["edge"], int(m["t_ns"]), dict(m.get("attrs", {}))) for m in data["markers"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not an OpScope telemetry JSON file ({e})") from e
    return series, marks


def _nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _open_for_writing(path: Path | str) -> TextIO:
    try:
        return open(path, "w", newline="", encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot write ({e.strerror}); choose another file") from e


class CsvSink:
    """Live CSV for ``opscope monitor --csv``: a header with the sampler's series, then one row per
    snapshot, flushed each time so the file is usable while the monitor runs."""

    def __init__(self, path: Path | str, units: dict[str, str]) -> None:
        self.names = list(units)
        self._f = _open_for_writing(path)
        self._w = csv.writer(self._f)
        self._w.writerow(["t_ns", *(f"{n} [{units[n]}]" for n in self.names)])
        self.rows = 0

    def write(self, t_ns: int, values: dict[str, float]) -> None:
        self._w.writerow([t_ns, *(_cell(values.get(n)) for n in self.names)])
        self._f.flush()
        self.rows += 1

    def close(self) -> None:
        self._f.close()

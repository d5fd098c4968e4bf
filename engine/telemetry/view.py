"""How ``opscope monitor`` shows a snapshot: one table per kind of entity (GPUs, host, allocators),
one row per entity. On a terminal the tables refresh in place (rich Live); piped, each tick prints
plain fixed-width lines like ``nvidia-smi dmon``, with the headers once at the top."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from opscope.engine.core.units import format_bytes
from opscope.engine.telemetry.nvml import describe_reasons

Fmt = Callable[[float], str]


def _num(fmt: str) -> Fmt:
    return lambda v: "-" if math.isnan(v) else format(v, fmt)


def _bytes(v: float) -> str:
    return "-" if math.isnan(v) else format_bytes(v, digits=3).replace(" ", "")  # "1.00GiB": narrow columns


def _rate(v: float) -> str:
    return "-" if math.isnan(v) else _bytes(v) + "/s"


@dataclass(frozen=True)
class Column:
    label: str
    key: str  # full series name; "{e}" stands for the entity (gpu0, amd1, torch.cuda0)
    fmt: Fmt
    width: int = 8


@dataclass(frozen=True)
class Kind:
    title: str
    pattern: str  # regex whose group 1 is the entity, matched against series names
    columns: tuple[Column, ...]


_PCT, _W, _MHZ, _C = _num(".0f"), _num(".0f"), _num(".0f"), _num(".0f")
_GPU_COLUMNS = (
    Column("util%", "{e}.util_pct", _PCT, 5),
    Column("mem%", "{e}.mem_util_pct", _PCT, 5),
    Column("used", "{e}.mem_used_bytes", _bytes),
    Column("total", "{e}.mem_total_bytes", _bytes),
    Column("pwr W", "{e}.power_w", _W, 6),
    Column("limit W", "{e}.power_limit_w", _W, 7),
    Column("temp C", "{e}.temp_c", _C, 6),
    Column("sm MHz", "{e}.sm_clock_mhz", _MHZ, 6),
    Column("mem MHz", "{e}.mem_clock_mhz", _MHZ, 7),
    Column("pcie tx", "{e}.pcie_tx_bytes_s", _rate, 10),
    Column("pcie rx", "{e}.pcie_rx_bytes_s", _rate, 10),
    Column("reasons", "{e}.clock_event_reasons", describe_reasons, 10),
    Column("proc mem", "{e}.proc_mem_bytes", _bytes),
)
KINDS = (
    Kind("NVIDIA GPUs", r"^(gpu\d+)\.", _GPU_COLUMNS),
    Kind("AMD GPUs", r"^(amd\d+)\.", _GPU_COLUMNS),
    Kind(
        "host",
        r"^(host)\.",
        (
            Column("cpu%", "host.cpu_pct", _PCT, 5),
            Column("cores %", "host.cpu*_pct", _PCT, 12),
            Column("ram used", "host.ram_used_bytes", _bytes),
            Column("ram total", "host.ram_total_bytes", _bytes, 9),
            Column("proc rss", "proc.rss_bytes", _bytes),
            Column("proc cpu%", "proc.cpu_pct", _PCT, 9),
        ),
    ),
    Kind(
        "torch allocator",
        r"^(torch\.cuda\d+)\.",
        (
            Column("allocated", "{e}.allocated_bytes", _bytes, 9),
            Column("reserved", "{e}.reserved_bytes", _bytes),
            Column("peak", "{e}.peak_bytes", _bytes),
        ),
    ),
    Kind(
        "MLX allocator",
        r"^(mlx)\.",
        (
            Column("active", "{e}.active_bytes", _bytes),
            Column("cache", "{e}.cache_bytes", _bytes),
            Column("peak", "{e}.peak_bytes", _bytes),
        ),
    ),
)


class MonitorView:
    """Which tables, rows and columns to show, fixed from the sampler's series at start."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.groups: list[tuple[Kind, list[str], list[Column]]] = []
        for kind in KINDS:
            entities = list(dict.fromkeys(m.group(1) for n in names if (m := re.match(kind.pattern, n))))
            if entities:
                cols = [c for c in kind.columns if self._has(c, entities[0])]
                self.groups.append((kind, entities, cols))

    def _has(self, col: Column, entity: str) -> bool:
        key = col.key.format(e=entity)
        if "*" in key:
            return any(re.fullmatch(_glob(key), n) for n in self.names)
        return key in self.names

    def cell(self, col: Column, entity: str, values: Mapping[str, float]) -> str:
        key = col.key.format(e=entity)
        if "*" in key:  # per-core CPU: a compact list, or min/median/max on big machines
            cores = [values.get(n, math.nan) for n in self.names if re.fullmatch(_glob(key), n)]
            return _cores(cores, col.fmt)
        return col.fmt(values.get(key, math.nan))

    def header_lines(self) -> list[str]:
        return [
            _line("# " + kind.title.split()[0], ["t s", *(c.label for c in cols)], [8, *(c.width for c in cols)])
            for kind, _, cols in self.groups
        ]

    def lines(self, t_s: float, values: Mapping[str, float]) -> list[str]:
        out = []
        for _kind, entities, cols in self.groups:
            for e in entities:
                cells = [f"{t_s:.1f}", *(self.cell(c, e, values) for c in cols)]
                out.append(_line(e, cells, [8, *(c.width for c in cols)]))
        return out

    def tables(self, values: Mapping[str, float]) -> list:
        from rich.table import Table

        tables = []
        for kind, entities, cols in self.groups:
            table = Table(title=kind.title, title_justify="left", expand=False)
            table.add_column("", style="bold")
            for c in cols:
                table.add_column(c.label, justify="right")
            for e in entities:
                table.add_row(e, *(self.cell(c, e, values) for c in cols))
            tables.append(table)
        return tables


def _glob(key: str) -> str:
    return re.escape(key).replace(r"\*", r"\d+")


def _cores(values: list[float], fmt: Fmt) -> str:
    if len(values) <= 8:
        return " ".join(fmt(v) for v in values)
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return "-"
    return "/".join(fmt(v) for v in (ordered[0], ordered[len(ordered) // 2], ordered[-1]))


def _line(first: str, cells: list[str], widths: list[int]) -> str:
    return f"{first:<14}" + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths))

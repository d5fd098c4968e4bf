"""Roofline: each llm/matmul/attention point of a run placed by arithmetic intensity (FLOP/byte)
against the compute and bandwidth ceilings (engine.bench.peaks: theoretical and measured).

The work per unit of a point's primary value (a token for llm, a call for matmul and attention):

- matmul ``n``: 2·n³ FLOP over 3·n²·s bytes (A and B read, C written once: the least traffic any
  kernel needs; s = bytes per element), so its intensity is an upper bound.
- attention ``T``: 2·B·H·T²·D FLOP (causal) over 4·B·H·T·D·s bytes (Q, K, V read, O written).
- llm ``ppN``/``tgN``: what the llm suite stored per token in its settings (``roofline``): FLOP
  from the model shape, bytes = weights read per forward (once per pp pass, shared by its N tokens)
  plus the KV cache read; runs saved before that have no llm points (said in ``left_out``).

Ceilings: the run's stored peaks where it has them (llm: FLOP/s and bytes/s; matmul: FLOP/s), else
this machine's current ones (peaks.peak_set), each labelled with where it came from. The attainable
rate at intensity I is min(P, I·B); a point's ``pct_of_roof`` is its FLOP/s over that, against the
highest valid ceilings of each kind (theoretical if no measured one).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from opscope.engine.core.results import RunResult

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SUITES = ("llm", "matmul", "attention")


@dataclass(frozen=True)
class Ceiling:
    kind: str  # "compute" (FLOP/s) | "bandwidth" (bytes/s)
    basis: str  # "theoretical" | "measured"
    value: float
    label: str
    origin: str  # "stored with the run" | "this machine now"


@dataclass(frozen=True)
class RoofPoint:
    name: str
    suite: str
    intensity: float  # FLOP per byte
    flop_s: float  # achieved, from the median of the point's samples
    attainable: float | None = None  # min(P, I·B) with the best ceilings; None without both kinds
    quality: str | None = None
    bound: str | None = None  # "compute" | "memory" (which roof holds it); None without both kinds

    @property
    def bytes_s(self) -> float:
        return self.flop_s / self.intensity

    @property
    def pct_of_roof(self) -> float | None:
        return self.flop_s / self.attainable * 100.0 if self.attainable else None


@dataclass
class Roofline:
    run: str
    kind: str
    device: str
    dtype: str
    points: list[RoofPoint] = field(default_factory=list)
    ceilings: list[Ceiling] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # "<point>: why"
    notes: list[str] = field(default_factory=list)  # a missing ceiling and how to get one

    def best(self, kind: str) -> Ceiling | None:
        """The ceiling of ``kind`` a point is held to: measured where there is one, else theoretical."""
        of = [c for c in self.ceilings if c.kind == kind]
        return next((c for c in of if c.basis == "measured"), None) or next(iter(of), None)

    @property
    def ridge(self) -> float | None:
        """The intensity where the bandwidth roof meets the compute roof (FLOP/byte)."""
        p, b = self.best("compute"), self.best("bandwidth")
        return p.value / b.value if p and b else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "kind": self.kind,
            "device": self.device,
            "dtype": self.dtype,
            "ridge_flop_per_byte": self.ridge,
            "ceilings": [asdict(c) for c in self.ceilings],
            "points": [
                {
                    "name": p.name,
                    "suite": p.suite,
                    "intensity_flop_per_byte": p.intensity,
                    "flop_s": p.flop_s,
                    "bytes_s": p.bytes_s,
                    "attainable_flop_s": p.attainable,
                    "pct_of_roof": p.pct_of_roof,
                    "bound": p.bound,
                    "quality": p.quality,
                }
                for p in self.points
            ],
            "left_out": self.left_out,
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Roofline:
        """The inverse of ``as_dict`` (a roofline computed in another process, sent as JSON)."""
        points = [
            RoofPoint(
                p["name"],
                p["suite"],
                p["intensity_flop_per_byte"],
                p["flop_s"],
                p.get("attainable_flop_s"),
                p.get("quality"),
                p.get("bound"),
            )
            for p in d["points"]
        ]
        return cls(
            d["run"],
            d["kind"],
            d["device"],
            d["dtype"],
            points=points,
            ceilings=[Ceiling(**c) for c in d["ceilings"]],
            left_out=list(d.get("left_out", [])),
            notes=list(d.get("notes", [])),
        )


# --- work per unit ------------------------------------------------------------------------------


def _matmul_work(params: dict, dtype: str) -> tuple[float, float]:
    n, s = params["n"], DTYPE_BYTES[params.get("dtype", dtype)]
    return 2.0 * n**3, 3.0 * n * n * s


def _attention_work(params: dict, sp: dict, dtype: str) -> tuple[float, float]:
    b, h, d, t = sp.get("batch", 1), sp["heads"], sp["head_dim"], params["seq"]
    return 2.0 * b * h * t * t * d, 4.0 * b * h * t * d * DTYPE_BYTES[dtype]


def _per_second(unit: str, median: float, flop: float) -> float | None:
    """Units of work per second from a primary median in ``unit``."""
    if unit == "tok/s":
        return median
    if unit == "ms":
        return 1e3 / median if median > 0 else None
    if unit == "GFLOP/s":
        return median * 1e9 / flop
    return None


def _work(result: RunResult, m) -> tuple[float, float] | str:
    """(FLOP, bytes) per unit of ``m``'s primary value, or why there is none."""
    sp = result.settings.get("suite_params", {})
    dtype = result.settings.get("dtype", "float32")
    if result.kind == "matmul":
        return _matmul_work(m.params, dtype)
    if result.kind == "attention":
        if "heads" not in sp:
            return "the run's settings lack heads/head_dim"
        return _attention_work(m.params, sp, dtype)
    stored = (sp.get("roofline") or {}).get(m.name)
    if not stored:
        return "no work per token stored (a run saved before the roofline; rerun the suite)"
    return stored["flop"], stored["bytes"]


def _is_primary(result: RunResult, m) -> bool:
    if m.status != "ok" or not m.samples:
        return False
    if result.kind == "matmul":
        return m.name.startswith("matmul_") and "." not in m.name
    if result.kind == "attention":
        return m.name.startswith("attn_") and "." not in m.name
    return (m.name.startswith(("pp", "tg"))) and "." not in m.name and m.unit == "tok/s"


# --- ceilings -----------------------------------------------------------------------------------


def _ceilings_from(pset: dict | None, kind: str, origin: str) -> list[Ceiling]:
    out = []
    for basis in ("theoretical", "measured"):
        d = (pset or {}).get(basis)
        if d and d.get("value"):
            out.append(Ceiling(kind, basis, float(d["value"]), d.get("label") or f"{basis}", origin))
    return out


_HOW = {
    "compute": "run `opscope bench matmul` (full, not --quick) on a quiet machine to measure one",
    "bandwidth": "run `opscope bench bandwidth` (full, not --quick) on a quiet machine to measure one",
}


def _missing(ceilings: list[Ceiling]) -> list[str]:
    have = {c.kind for c in ceilings}
    return [
        f"no {kind} ceiling (no theoretical figure for this device and no measured one): {_HOW[kind]}; "
        f"points are placed without a roof"
        for kind in ("compute", "bandwidth")
        if kind not in have
    ]


def _ceilings(result: RunResult, device: str, dtype: str) -> list[Ceiling]:
    from opscope.engine.bench.ceilings import peaks

    sp = result.settings.get("suite_params", {})
    stored = sp.get("peaks") or {}
    if result.kind == "llm":
        flop, bw = stored.get("flop"), stored.get("bytes")
    elif result.kind == "matmul":
        flop, bw = stored.get(dtype) or next(iter(stored.values()), None), None
    else:
        flop, bw = None, None
    out = _ceilings_from(flop, "compute", "stored with the run")
    if not out:
        out = _ceilings_from(peaks.peak_set(device, "matmul", dtype), "compute", "this machine now")
    bws = _ceilings_from(bw, "bandwidth", "stored with the run")
    if not bws:
        bws = _ceilings_from(peaks.peak_set(device, "bandwidth"), "bandwidth", "this machine now")
    return out + bws


# --- the roofline -------------------------------------------------------------------------------


def from_run(result: RunResult, store=None, probe: bool = False) -> Roofline:
    """The roofline of a stored llm, matmul or attention run; ConfigError for another kind.

    Without a bandwidth ceiling (no theoretical figure for the device, none measured in the peaks
    cache) the memory roof comes from the newest bandwidth run in ``store`` on the same device,
    else, with ``probe``, from a short copy measured now (memory_probe): a decode point, memory
    bound, is otherwise placed under no roof at all."""
    from opscope.engine.core.errors import ConfigError

    if result.kind not in SUITES:
        raise ConfigError(
            f"run {result.name!r} is a {result.kind!r} run; a roofline places "
            f"{', '.join(SUITES)} points: pick a run of one of those suites"
        )
    device = result.settings.get("device", "cpu")
    dtype = result.settings.get("dtype", "float32")
    roof = Roofline(result.name, result.kind, device, dtype, ceilings=_ceilings(result, device, dtype))
    if not any(c.kind == "bandwidth" for c in roof.ceilings):
        found = stored_bandwidth(store, device) if store is not None else None
        found = found or (memory_probe(device) if probe else None)
        roof.ceilings += [found] if found else []
    roof.notes = _missing(roof.ceilings)
    p, b = roof.best("compute"), roof.best("bandwidth")
    for m in result.metrics:
        if not _is_primary(result, m):
            continue
        work = _work(result, m)
        if isinstance(work, str):
            roof.left_out.append(f"{m.name}: {work}")
            continue
        flop, nbytes = work
        rate = _per_second(m.unit, statistics.median(m.samples), flop)
        if not rate or flop <= 0 or nbytes <= 0:
            roof.left_out.append(f"{m.name}: no rate in {m.unit!r}")
            continue
        intensity = flop / nbytes
        attainable = bound = None
        if p and b:
            attainable = min(p.value, intensity * b.value)
            bound = "compute" if intensity >= p.value / b.value else "memory"
        roof.points.append(RoofPoint(m.name, result.kind, intensity, rate * flop, attainable, m.quality, bound))
    return roof


def stored_bandwidth(store, device: str) -> Ceiling | None:
    """The best median of the newest bandwidth run on ``device`` in ``store``, as a ceiling."""
    from opscope.engine.core.units import format_rate

    for info in store.list(kind="bandwidth", limit=20):
        result = store.load(info.id).result
        if result.settings.get("device", "cpu") != device:
            continue
        rates = [
            statistics.median(m.samples) * 1e9
            for m in result.metrics
            if m.unit == "GB/s" and m.status == "ok" and m.samples
        ]
        if rates:
            value = max(rates)
            return Ceiling(
                "bandwidth",
                "measured",
                value,
                f"measured {format_rate(value, 'B/s')} (bandwidth run {result.name})",
                f"bandwidth run {result.name}",
            )
    return None


PROBE_MIB = 64  # well past the last-level cache of a desktop CPU, small enough for any GPU
PROBE_REPEATS = 6


def memory_probe(device: str) -> Ceiling | None:
    """A short copy of PROBE_MIB MiB on ``device`` (read + write counted, the bandwidth suite's
    measure), fastest of PROBE_REPEATS: a fraction of a second, a rougher figure than the suite's."""
    import time

    import torch
    from opscope.engine.core.units import format_rate

    try:
        src = torch.ones(PROBE_MIB * 2**20 // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
    except (RuntimeError, ValueError):  # no such device here, or no memory for the buffers
        return None
    sync = torch.cuda.synchronize if src.device.type == "cuda" else (lambda: None)
    best = math.inf
    for _ in range(PROBE_REPEATS):
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t0)
    value = 2.0 * src.numel() * 4 / best
    return Ceiling(
        "bandwidth",
        "measured",
        value,
        f"measured {format_rate(value, 'B/s')} (short probe)",
        f"a {PROBE_MIB} MiB copy just now (`opscope bench bandwidth` measures a steadier one)",
    )


def text(roof: Roofline) -> str:
    from opscope.engine.core.units import format_rate

    lines = [f"roofline of {roof.kind} run {roof.run!r} ({roof.device}, {roof.dtype})"]
    for c in roof.ceilings:
        unit = "FLOP/s" if c.kind == "compute" else "B/s"
        lines.append(f"  {c.kind} ceiling: {c.basis} {format_rate(c.value, unit)} ({c.origin})")
    if roof.ridge:
        lines.append(f"  ridge point: {roof.ridge:.2f} FLOP/byte (below: memory-bound, above: compute-bound)")
    head = f"{'point':<24} {'FLOP/byte':>10} {'achieved':>16} {'attainable':>16} {'% of roof':>9}  bound    quality"
    lines += ["", head, "-" * len(head)]
    for pt in sorted(roof.points, key=lambda q: q.intensity):
        att = format_rate(pt.attainable, "FLOP/s") if pt.attainable else "n/a"
        pct = f"{pt.pct_of_roof:.1f}" if pt.pct_of_roof is not None else "n/a"
        lines.append(
            f"{pt.name:<24} {pt.intensity:>10.3g} {format_rate(pt.flop_s, 'FLOP/s'):>16} {att:>16} "
            f"{pct:>9}  {pt.bound or 'n/a':<8} {pt.quality or '-'}"
        )
    if not roof.points:
        lines.append("(no points)")
    for why in roof.left_out:
        lines.append(f"left out: {why}")
    lines += roof.notes
    return "\n".join(lines) + "\n"


# --- export -------------------------------------------------------------------------------------


def _log_range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))


def plot_ranges(roof: Roofline) -> tuple[tuple[float, float], tuple[float, float]]:
    """Log-scale (x, y) ranges covering every point, ceiling and the ridge."""
    xs = [p.intensity for p in roof.points] + ([roof.ridge] if roof.ridge else [])
    ys = [p.flop_s for p in roof.points] + [c.value for c in roof.ceilings if c.kind == "compute"]
    xs, ys = xs or [0.1, 100.0], ys or [1e9, 1e12]
    (x0, x1), (y0, y1) = _log_range(xs), _log_range(ys)
    return (x0 / 10, x1 * 10), (y0 / 10, y1 * 2)


def roof_lines(roof: Roofline) -> list[tuple[str, list[tuple[float, float]]]]:
    """One polyline per (compute, bandwidth) ceiling pair: (label, [(x, y), ...]) over the x range."""
    (x0, x1), _ = plot_ranges(roof)
    out = []
    computes = [c for c in roof.ceilings if c.kind == "compute"]
    bws = [c for c in roof.ceilings if c.kind == "bandwidth"]
    if not bws:  # one roof only: still drawn, so the points have something to be read against
        return [(f"{p.basis} compute", [(x0, p.value), (x1, p.value)]) for p in computes]
    if not computes:
        return [(f"{b.basis} bandwidth", [(x0, x0 * b.value), (x1, x1 * b.value)]) for b in bws]
    for p in computes:
        for b in bws:
            ridge = p.value / b.value
            pts = (
                [(x0, x0 * b.value)]
                + ([(ridge, p.value)] if x0 < ridge < x1 else [])
                + [(x1, min(p.value, x1 * b.value))]
            )
            out.append((f"{p.basis} compute / {b.basis} bandwidth", pts))
    return out


def svg(roof: Roofline, width: int = 800, height: int = 520) -> str:
    """The roofline as a self-contained SVG (no plotting library needed)."""
    from opscope.engine.core.units import format_rate

    (x0, x1), (y0, y1) = plot_ranges(roof)
    left, right, top, bottom = 80, 20, 40, 60
    w, h = width - left - right, height - top - bottom

    def X(x: float) -> float:
        return left + (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * w

    def Y(y: float) -> float:
        return top + h - (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * h

    def esc(s: str) -> str:
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{esc(f"Roofline: {roof.kind} run {roof.run} ({roof.device}, {roof.dtype})")}</text>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
    ]
    for e in range(round(math.log10(x0)), round(math.log10(x1)) + 1):
        out.append(
            f'<line x1="{X(10**e):.1f}" y1="{top}" x2="{X(10**e):.1f}" y2="{top + h}" stroke="#eee"/>'
            f'<text x="{X(10**e):.1f}" y="{top + h + 15}" text-anchor="middle">{10**e:g}</text>'
        )
    for e in range(round(math.log10(y0)), round(math.log10(y1)) + 1):
        if y0 <= 10**e <= y1:
            out.append(
                f'<line x1="{left}" y1="{Y(10**e):.1f}" x2="{left + w}" y2="{Y(10**e):.1f}" stroke="#eee"/>'
                f'<text x="{left - 5}" y="{Y(10**e) + 4:.1f}" text-anchor="end">{esc(format_rate(10**e, "FLOP/s", digits=2))}</text>'
            )
    out.append(
        f'<text x="{left + w / 2}" y="{height - 15}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>'
    )
    colours = ["#c0392b", "#2980b9", "#8e44ad", "#16a085"]
    for i, (label, pts) in enumerate(roof_lines(roof)):
        path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colours[i % 4]}" stroke-width="2"/>'
            f'<text x="{left + w - 5}" y="{top + 14 + 14 * i}" text-anchor="end" fill="{colours[i % 4]}">{esc(label)}</text>'
        )
    for p in roof.points:
        out.append(
            f'<circle cx="{X(p.intensity):.1f}" cy="{Y(p.flop_s):.1f}" r="4" fill="#333"><title>{esc(p.name)}: '
            f"{p.intensity:.3g} FLOP/byte, {esc(format_rate(p.flop_s, 'FLOP/s'))}</title></circle>"
            f'<text x="{X(p.intensity) + 6:.1f}" y="{Y(p.flop_s) - 4:.1f}">{esc(p.name)}</text>'
        )
    out.append("</svg>\n")
    return "\n".join(out)


def png(roof: Roofline, path: str) -> None:
    """Writes a PNG with matplotlib; ConfigError naming the way out where it is not installed."""
    from opscope.engine.core.errors import ConfigError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ConfigError(
            "PNG export needs matplotlib (pip install matplotlib); write an .svg instead "
            "(no extra package), or export PNG from the GUI's Roofline view"
        ) from e
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for label, pts in roof_lines(roof):
        ax.plot(*zip(*pts), label=label)
    ax.scatter([p.intensity for p in roof.points], [p.flop_s for p in roof.points], color="#333", zorder=3)
    for p in roof.points:
        ax.annotate(p.name, (p.intensity, p.flop_s), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP/byte)",
        ylabel="FLOP/s",
        title=f"Roofline: {roof.kind} run {roof.run} ({roof.device}, {roof.dtype})",
    )
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)

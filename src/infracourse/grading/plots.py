"""Plots beside a kernel week's grade: the learner's kernels on this device's roofline, and time per shape
against the reference (torch, cuBLAS). PNG files drawn on matplotlib's Agg canvas: no display and no global
pyplot state, so grading in a terminal or a CI job draws the same files.

Graders record what the plots need with the figure they already record (grading.results.Figure):
    record(name, value, ..., label="softmax 8192x4096 fp32", bytes=..., flops=..., seconds=...,
           reference_seconds=..., reference="torch.softmax")
A figure with bytes, flops and seconds is a point on the roofline; one with seconds and reference_seconds is
a pair of bars (zero counts as absent). Figures with the same label are one kernel: the first recorded is drawn.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infracourse.grading.results import GradeResult


@dataclass(frozen=True)
class KernelFigure:
    label: str
    check: str
    bytes: float | None
    flops: float | None
    seconds: float | None
    reference_seconds: float | None
    reference: str

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, flop per byte moved."""
        return self.flops / self.bytes

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9


def _positive(value: Any) -> float | None:
    """A ceiling's number when it is a finite positive one (figures are checked by Figure already)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _grade(result: GradeResult | dict) -> GradeResult:
    return result if isinstance(result, GradeResult) else GradeResult.from_dict(result)


def kernel_figures(result: GradeResult | dict) -> list[KernelFigure]:
    """The timed kernels a grade (or its as_dict()) recorded, one per label, in the order the checks
    recorded them."""
    found: dict[str, KernelFigure] = {}
    for check in _grade(result).checks:
        for name, figure in check.figures.items():
            if not figure.seconds:
                continue
            label = figure.label or name
            kernel = KernelFigure(label=label, check=check.id, bytes=figure.bytes or None,
                                  flops=figure.flops or None, seconds=figure.seconds,
                                  reference_seconds=figure.reference_seconds or None,
                                  reference=figure.reference or "reference")
            known = found.get(label)
            if known is None:
                found[label] = kernel
            else:  # the same kernel recorded by two checks: keep the first, fill in what it lacked
                found[label] = KernelFigure(
                    label=label, check=known.check, bytes=known.bytes or kernel.bytes,
                    flops=known.flops or kernel.flops, seconds=known.seconds,
                    reference_seconds=known.reference_seconds or kernel.reference_seconds,
                    reference=known.reference if known.reference_seconds else kernel.reference)
    return list(found.values())


def _ceiling_values(ceilings: Any) -> tuple[float | None, dict[str, float], str]:
    """(copy GB/s, {dtype: matmul TFLOP/s}, device) from a hardware.Ceilings, its dict, or None."""
    if ceilings is None:
        return None, {}, ""
    get = ceilings.get if isinstance(ceilings, dict) else lambda key, default=None: getattr(ceilings, key, default)
    peaks = {str(k): float(v) for k, v in (get("matmul_tflops", {}) or {}).items() if _positive(v)}
    return _positive(get("copy_gbps")), peaks, str(get("device", "") or "")


def write_kernel_plots(result: GradeResult | dict, ceilings: Any, out_dir: Path | str) -> list[Path]:
    """Draw `<week>-roofline.png` and `<week>-times.png` into out_dir from a GradeResult (or its as_dict()).

    `ceilings` (hardware.Ceilings, its dict, or None) supplies the roofs; without them the points are drawn
    alone. Returns the files written: none when the grade recorded no timed kernel (a CPU-only grade)."""
    grade = _grade(result)
    week, device = grade.week or "week", grade.device
    figures = kernel_figures(grade)
    out = Path(out_dir)
    written = []
    points = [f for f in figures if f.bytes and f.flops]
    if points:
        out.mkdir(parents=True, exist_ok=True)
        written.append(_roofline(points, ceilings, out / f"{week}-roofline.png", f"{week} on {device}".strip()))
    pairs = [f for f in figures if f.reference_seconds]
    if pairs:
        out.mkdir(parents=True, exist_ok=True)
        written.append(_times(pairs, out / f"{week}-times.png", f"{week}: time per shape on {device}".strip()))
    return written


def _canvas(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _roofline(points: list[KernelFigure], ceilings: Any, path: Path, title: str) -> Path:
    copy_gbps, peaks, _ = _ceiling_values(ceilings)
    figure = _canvas(7.5, 5)
    axes = figure.add_subplot()
    intensities = [p.intensity for p in points]
    ridges = [peak * 1e3 / copy_gbps for peak in peaks.values()] if copy_gbps else []
    low = min(intensities + ridges) / 10
    high = max(intensities + ridges) * 10
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    if copy_gbps:
        top = max(peaks.values(), default=copy_gbps * high / 1e3)
        axes.plot(xs, [min(x * copy_gbps / 1e3, top) for x in xs], color="black", linewidth=1.5,
                  label=f"copy bandwidth {copy_gbps:,.0f} GB/s")
        for (dtype, peak), style in zip(sorted(peaks.items(), key=lambda kv: -kv[1]), ["--", "-.", ":", (0, (5, 5))]):
            ridge = peak * 1e3 / copy_gbps
            axes.plot([ridge, high], [peak, peak], linestyle=style, color="grey",
                      label=f"{dtype} matmul {peak:,.0f} TFLOP/s")
    roofs = axes.legend(fontsize=7, loc="lower right") if copy_gbps else None
    for point, marker in zip(points, "osD^vP*Xhp" * len(points)):
        attainable = min(point.intensity * copy_gbps / 1e3, max(peaks.values(), default=math.inf)) \
            if copy_gbps else None
        share = f", {point.tflops / attainable:.0%} of roof" if attainable else ""
        axes.scatter([point.intensity], [point.tflops], s=45, marker=marker, zorder=3,
                     label=f"{point.label}: {point.gbps:,.0f} GB/s, {point.tflops:,.2f} TFLOP/s{share}")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(low, high)
    axes.set_xlabel("arithmetic intensity (flop / byte moved)")
    axes.set_ylabel("achieved TFLOP/s")
    axes.set_title(title + ("" if copy_gbps else " (no calibrated ceilings: points only)"), fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    kernels = [h for h in axes.collections]
    axes.legend(handles=kernels, fontsize=7, loc="upper left", title="your kernels", title_fontsize=7)
    if roofs is not None:
        axes.add_artist(roofs)
    figure.savefig(path)
    return path


def _times(pairs: list[KernelFigure], path: Path, title: str) -> Path:
    figure = _canvas(7.5, 1.4 + 0.6 * len(pairs))
    axes = figure.add_subplot()
    rows = range(len(pairs))
    yours = [p.seconds * 1e6 for p in pairs]
    theirs = [p.reference_seconds * 1e6 for p in pairs]
    axes.barh([r + 0.2 for r in rows], yours, height=0.38, label="your kernel")
    axes.barh([r - 0.2 for r in rows], theirs, height=0.38, label=" / ".join(sorted({p.reference for p in pairs})))
    for r, pair in zip(rows, pairs):
        speedup = pair.reference_seconds / pair.seconds
        axes.annotate(f"{speedup:.2f}x", (max(yours[r], theirs[r]), r), textcoords="offset points", xytext=(4, -3),
                      fontsize=8)
    axes.set_yticks(list(rows), [p.label for p in pairs], fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("time per call, µs (post-warm-up, device-synchronised; shorter is better)")
    axes.set_xlim(0, max(yours + theirs) * 1.2)
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8, loc="best")
    figure.savefig(path)
    return path

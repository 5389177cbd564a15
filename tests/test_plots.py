"""The grade's kernel plots: drawn from recorded figures, as valid PNG files, on CPU with synthetic figures."""
from pathlib import Path

import pytest

from infracourse.grading.plots import kernel_figures, write_kernel_plots
from infracourse.grading.results import CheckResult, FigureError, GradeResult
from infracourse.hardware import Ceilings

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CEILINGS = Ceilings(device="NVIDIA H200", copy_gbps=4244.8,
                    matmul_tflops={"float32": 50.8, "tf32": 366.5, "float16": 683.6, "bfloat16": 694.0})
WIDE_BYTES, WIDE_FLOPS = 2 * 8192 * 4096 * 4, 5 * 8192 * 4096


def _check(check_id, figures, status="passed"):
    return CheckResult(id=check_id, title=check_id, kind="performance", needs="cuda", status=status, figures=figures)


def _grade(checks):
    return GradeResult(week="week08", tier="cuda", device="NVIDIA H200", fingerprint="f", started_at="t",
                       seconds=1.0, checks=checks)


def _synthetic():
    wide = {"label": "softmax 8192x4096 fp32", "bytes": WIDE_BYTES, "flops": WIDE_FLOPS}
    return _grade([
        _check("correct", {}),
        _check("bandwidth", {"softmax 8192x4096 fp32 bandwidth": {
            "value": 3788.0, "target": 2971.4, "unit": "GB/s", **wide, "seconds": 70.9e-6}}),
        _check("vs-torch", {"speed-up": {"value": 1.55, "target": 1.0, "unit": "x", **wide, "seconds": 71.2e-6,
                                         "reference_seconds": 110.0e-6, "reference": "torch.softmax"}}),
        _check("long-rows-vs-torch", {"speed-up": {
            "value": 1.29, "unit": "x", "label": "softmax 1024x131072 fp32", "bytes": 2 * 2**27 * 4,
            "flops": 5 * 2**27, "seconds": 408e-6, "reference_seconds": 527e-6, "reference": "torch.softmax"}},
            status="failed"),
        _check("matmul", {"bf16 4096": {"value": 700.0, "unit": "TFLOP/s", "bytes": 3 * 4096**2 * 2,
                                        "flops": 2 * 4096**3, "seconds": 2 * 4096**3 / 700e12}}),
    ])


def _is_png(path: Path) -> bool:
    import matplotlib.image

    return path.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(path).shape[0] > 100


def test_figures_become_one_kernel_per_label():
    figures = {f.label: f for f in kernel_figures(_synthetic())}
    assert list(figures) == ["softmax 8192x4096 fp32", "softmax 1024x131072 fp32", "bf16 4096"]
    wide = figures["softmax 8192x4096 fp32"]
    assert wide.seconds == 70.9e-6  # the first check that recorded it
    assert wide.reference_seconds == 110.0e-6 and wide.reference == "torch.softmax"  # filled in by the second
    assert wide.intensity == pytest.approx(5 / 8)
    assert wide.gbps == pytest.approx(WIDE_BYTES / 70.9e-6 / 1e9)


@pytest.mark.parametrize("ceilings", [CEILINGS, vars(CEILINGS), None], ids=["Ceilings", "dict", "none"])
def test_writes_roofline_and_times_as_png(tmp_path, ceilings):
    paths = write_kernel_plots(_synthetic(), ceilings, tmp_path / "plots")
    assert [p.name for p in paths] == ["week08-roofline.png", "week08-times.png"]
    assert all(p.parent == tmp_path / "plots" and _is_png(p) for p in paths)


def test_accepts_the_stored_dict_of_a_grade(tmp_path):
    paths = write_kernel_plots(_synthetic().as_dict(), CEILINGS, tmp_path)
    assert len(paths) == 2 and all(_is_png(p) for p in paths)


def test_a_grade_without_timed_kernels_draws_nothing(tmp_path):
    cpu_only = _grade([_check("correct", {"relative error": {"value": 1e-7}}),
                       _check("bandwidth", {}, status="blocked")])
    assert write_kernel_plots(cpu_only, None, tmp_path / "plots") == []
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("bad", [{"value": 1.0, "bytes": 8, "flops": 1, "seconds": float("nan")},
                                 {"value": 1.0, "bytes": "8", "flops": 1, "seconds": "x"},
                                 {"value": 1.0, "bytes": -8, "flops": 1, "seconds": 1e-6}], ids=["nan", "text", "negative"])
def test_bad_figures_never_reach_a_plot(tmp_path, bad):
    with pytest.raises(FigureError, match="figure 'bad'"):  # refused where a grade is built (grading.results.Figure)
        _check("bandwidth", {"bad": bad})
    stored = _grade([_check("bandwidth", {})]).as_dict()
    stored["checks"][0]["figures"] = {"bad": bad}
    with pytest.raises(FigureError):  # and where a stored grade is read back
        write_kernel_plots(stored, CEILINGS, tmp_path)


def test_zero_bytes_is_neither_a_point_nor_a_pair(tmp_path):
    zero = _grade([_check("bandwidth", {"zero": {"value": 1.0, "bytes": 0, "flops": 1, "seconds": 1e-6}})])
    assert [(f.label, f.bytes) for f in kernel_figures(zero)] == [("zero", None)]
    assert write_kernel_plots(zero, CEILINGS, tmp_path) == []

"""Week 6 report: the estimate against the measured peak, profiles at two lengths and two precisions, and the
synchronisation and copy that were removed."""
import pytest

from infracourse.grading.report import check_report

REQUIRED = {
    "Method": (r"torch\.profiler|profile_memory|key_averages|saved_tensors_hooks",
               "how memory and time were measured (torch.profiler settings, saved_tensors_hooks, allocator stats)"),
    "Results": (r"(?=[\s\S]*\|.*\d.*\|)(?=[\s\S]*(bf16|bfloat16))(?=[\s\S]*(fp32|float32))(?=[\s\S]*\.json)",
                "a table of step time and memory at two sequence lengths in fp32 and bf16, and the trace files "
                "(.json) it came from"),
    "Conclusion and limits": (
        r"(?=[\s\S]*(peak|max_memory_allocated))(?=[\s\S]*(_local_scalar_dense|\.item\(\)|synchroni[sz]))"
        r"(?=[\s\S]*(aten::cat|\bcop(y|ies)\b))",
        "the estimate against the measured peak with the difference explained, and the synchronisation and the "
        "copy you removed, with their effect"),
}


@pytest.mark.check("report")
def test_report(learner, hardware):
    check_report(learner.path("report.md"), hardware, required=REQUIRED)

"""Keep Triton's CPU interpreter usable with the NumPy a fresh install brings.

Triton 3.6's interpreter stores every scalar (a kernel argument such as K, or tl.cdiv(K, BLOCK)) as a
one-element NumPy array and turns it into a Python int with `int(array)`. NumPy 2.4 refuses that for arrays
with a dimension ("only 0-dimensional arrays can be converted to Python scalars"), so under
TRITON_INTERPRET=1 every loop whose bound is a runtime value (`for k in range(0, tl.cdiv(K, BLOCK_K))`)
crashes, in learners' kernels and in reference solutions alike (triton-lang/triton#9171, fixed upstream the
same way). `patch_interpreter_scalars()` reads the one element instead; compiled (GPU) kernels never go
through this path. Graders call it in their conftest.py, before any learner kernel runs.
"""
from __future__ import annotations


def patch_interpreter_scalars() -> bool:
    """Make the interpreter's scalar-to-int conversion work on NumPy >= 2.4. Idempotent; returns whether the
    interpreter is patched (False when Triton is absent)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = interpreter._patch_lang_tensor
    if getattr(original, "_infracourse_patched", False):
        return True

    def _patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # .item() takes the single element and still refuses a real block, as int() should
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    _patch_lang_tensor._infracourse_patched = True
    interpreter._patch_lang_tensor = _patch_lang_tensor
    return True

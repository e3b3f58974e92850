"""The flag fixture of the GPU tests (``harness.global_flags.restored``) puts back every process-wide
torch setting a test changed, also when the test fails (pure, CPU; the sync debug mode needs CUDA
and is checked only where a GPU is)."""
import pytest
import torch
from harness.global_flags import read_flags, restored

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run


def _change_everything():
    torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic = not torch.backends.cudnn.deterministic
    torch.set_float32_matmul_precision("medium")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(torch.get_num_threads() + 1)
    torch.set_default_dtype(torch.float64)
    torch.backends.cuda.enable_flash_sdp(not torch.backends.cuda.flash_sdp_enabled())
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")


def test_every_flag_comes_back():
    before = read_flags()
    assert {"backends.cuda.matmul.allow_tf32", "float32_matmul_precision", "deterministic_algorithms"} <= set(before)
    with restored():
        _change_everything()
        changed = read_flags()
        assert changed != before
    assert read_flags() == before
    # what a GPU test does most (tests/test_sharding_gpu.py): TF32 off, alone
    with restored():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    assert read_flags() == before


def test_flags_come_back_after_a_failure():
    before = read_flags()
    with pytest.raises(AssertionError), restored():
        _change_everything()
        raise AssertionError("test failed")
    assert read_flags() == before

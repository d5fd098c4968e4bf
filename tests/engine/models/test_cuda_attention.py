"""SDPA's backend choice on CUDA for models with a KV cache (docs/decisions/0010): cuDNN's attention
builds a graph per new shape, and every prompt length and decode step is one. The flag is torch's
own, process-wide; on CUDA it is off inside a cached inference pass and restored after. (No GPU
here: the choice is torch's global flag, which a CPU build holds too; the GPU check times it.)"""

import pytest
import torch
from opscope.engine.models.transformer import varying_shape_attention

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def cudnn_sdp_restored():
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(was)


def test_cached_inference_on_cuda_leaves_cudnn_out_and_restores_it():
    with torch.no_grad(), varying_shape_attention(CUDA, cached=True):
        assert torch.backends.cuda.cudnn_sdp_enabled() is False
    assert torch.backends.cuda.cudnn_sdp_enabled() is True


def test_restored_when_the_pass_raises():
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), varying_shape_attention(CUDA, cached=True):
        raise RuntimeError("boom")
    assert torch.backends.cuda.cudnn_sdp_enabled() is True


def test_a_user_who_turned_cudnn_off_keeps_it_off():
    torch.backends.cuda.enable_cudnn_sdp(False)
    with torch.no_grad(), varying_shape_attention(CUDA, cached=True):
        assert torch.backends.cuda.cudnn_sdp_enabled() is False
    assert torch.backends.cuda.cudnn_sdp_enabled() is False


@pytest.mark.parametrize(
    ("device", "cached", "grad"),
    [("cpu", True, False), ("cuda", False, False), ("cuda", True, True)],
    ids=["cpu", "no-cache", "training"],
)
def test_other_passes_keep_torchs_choice(device, cached, grad):
    with torch.set_grad_enabled(grad), varying_shape_attention(torch.device(device), cached=cached):
        assert torch.backends.cuda.cudnn_sdp_enabled() is True

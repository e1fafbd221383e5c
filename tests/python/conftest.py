"""Shared fixtures of the Python tests.

- Every test starts from its own fixed seed (derived from its name, shifted by the environment
  variable FLASHDSA_TEST_SEED), so data is random but each failure reproduces.
- `device` runs a test on "cpu" and "cuda". The CUDA case is skipped when no GPU is present, and
  when the test is marked `@pytest.mark.kernels("op", ...)` with an op this build cannot run on
  CUDA yet (flashdsa.has_cuda_kernel).
"""

import os
import zlib

import pytest
import torch

import flashdsa


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "kernels(*ops): raw flashdsa ops the test runs; CUDA cases skip ops without a CUDA kernel")


@pytest.fixture(autouse=True)
def _seed(request):
    base = int(os.environ.get("FLASHDSA_TEST_SEED", "0"))
    seed = base + zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    return seed


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("CUDA is not available")
        marker = request.node.get_closest_marker("kernels")
        missing = [op for op in (marker.args if marker else ()) if not flashdsa.has_cuda_kernel(op)]
        if missing:
            pytest.skip(f"no CUDA kernel in this build for: {', '.join(missing)}")
    return request.param

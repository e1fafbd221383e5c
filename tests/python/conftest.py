"""Shared fixtures of the Python tests.

- Every test starts from its own fixed seed (derived from its name, shifted by the environment
  variable FLASHDSA_TEST_SEED), so data is random but each failure reproduces.
- `device` runs a test on "cpu" and "cuda". The CUDA case is skipped when no GPU is present or
  when the extension was built without CUDA (flashdsa.built_with_cuda).
- `@pytest.mark.kernels("op", ...)` names the raw ops a test runs (documentation and selection).
"""

import os
import zlib

import pytest
import torch

import flashdsa


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "kernels(*ops): raw flashdsa ops the test runs")


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
        if not flashdsa.built_with_cuda():
            pytest.skip("flashdsa was built without CUDA")
    return request.param

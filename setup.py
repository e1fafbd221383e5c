"""Builds the FlashDSA PyTorch extension `flashdsa._C`.

    pip install --no-build-isolation -e .                          # CPU + CUDA (when nvcc is found)
    FLASHDSA_WITH_CUDA=0 MAX_JOBS=2 pip install --no-build-isolation -e .   # CPU backend only

One extension holds the framework-free library (csrc/common, csrc/cpu and, with CUDA, csrc/sm90)
plus the torch bindings (csrc/torch). CUDA code is compiled whenever a CUDA toolkit is found, even
without a GPU (the sm_90a kernels are built ahead of time; nothing is JIT-compiled). Ninja runs
MAX_JOBS compile jobs in parallel (torch's default when unset).
"""

import os
from pathlib import Path

from setuptools import setup
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parent
VERSION = {}
exec((ROOT / "python" / "flashdsa" / "_version.py").read_text(), VERSION)


def _sources(*patterns: str) -> list[str]:
    """Sorted source paths (relative to the repository root) matching the glob patterns."""
    found = {str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern)}
    return sorted(found)


def _cuda_enabled() -> bool:
    """CUDA is built unless FLASHDSA_WITH_CUDA=0 or no CUDA toolkit (nvcc) is found."""
    if os.environ.get("FLASHDSA_WITH_CUDA", "1") == "0":
        return False
    cuda_home = cpp_extension.CUDA_HOME
    return cuda_home is not None and (Path(cuda_home) / "bin" / "nvcc").exists()


def _extension():
    with_cuda = _cuda_enabled()
    sources = _sources("csrc/common/*.cpp", "csrc/cpu/*.cpp", "csrc/torch/*.cpp")
    # As in CMakeLists.txt: -ffp-contract=fast lets the CPU kernels use FMA; -Wno-psabi silences GCC's
    # notes about the 64-byte vector arguments of the (always inlined) SIMD helpers.
    cxx_flags = ["-O3", "-std=c++17", "-ffp-contract=fast", "-Wno-psabi"]
    if not with_cuda:
        print("flashdsa: building the CPU backend only (FLASHDSA_WITH_CUDA=0 or no nvcc found)")
        return cpp_extension.CppExtension(
            "flashdsa._C", sources, include_dirs=[str(ROOT / "include"), str(ROOT / "csrc")],
            extra_compile_args={"cxx": cxx_flags})

    print(f"flashdsa: building with CUDA (sm_90a) from {cpp_extension.CUDA_HOME}")
    sources += _sources("csrc/sm90/registry.cpp", "csrc/sm90/**/*.cu")
    nvcc_flags = [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-O3",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-lineinfo",
        # torch adds these for its own half/bf16 headers; our kernels never include torch and use
        # the CUDA bf16 operators, as in the CMake build.
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-DFLASHDSA_WITH_CUDA=1",
    ]
    return cpp_extension.CUDAExtension(
        "flashdsa._C", sources, include_dirs=[str(ROOT / "include"), str(ROOT / "csrc")],
        extra_compile_args={"cxx": cxx_flags + ["-DFLASHDSA_WITH_CUDA=1"], "nvcc": nvcc_flags})


setup(
    name="flashdsa",
    version=VERSION["__version__"],
    description="Fused DeepSeek Sparse Attention (DSA) training kernels for Hopper, with a PyTorch front end",
    package_dir={"": "python"},
    packages=["flashdsa", "flashdsa.megatron"],
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch>=2.5"],
    # Megatron Core backend (flashdsa.megatron, docs/megatron.md). megatron-core 0.19.2 declares
    # Python >= 3.12; on 3.11 install it with `pip install --ignore-requires-python` (scripts/install.sh).
    extras_require={"megatron": ["megatron-core==0.19.2"]},
)

"""Builds the FlashDSA Python package and its torch extension `flashdsa._C` through CMake.

    pip install --no-build-isolation -e .                          # CPU + CUDA (when nvcc is found)
    FLASHDSA_WITH_CUDA=0 MAX_JOBS=2 pip install --no-build-isolation -e .   # CPU backend only

The extension is the CMake target `flashdsa_torch` of CMakeLists.txt (the bindings in csrc/torch
linked with the same library the C++ tests use), built in the CMake build directory `build/` (or
$FLASHDSA_BUILD_DIR) that scripts/install.sh also uses, so every kernel is compiled once, with one
set of flags. CUDA code is compiled whenever a CUDA toolkit is found, even without a GPU (the
sm_90a kernels are built ahead of time; nothing is JIT-compiled). MAX_JOBS compile jobs run in
parallel (default: all cores).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
VERSION = {}
exec((ROOT / "python" / "flashdsa" / "_version.py").read_text(), VERSION)


def _cuda_enabled() -> bool:
    """CUDA is built unless FLASHDSA_WITH_CUDA=0 or no CUDA toolkit (nvcc) is found."""
    if os.environ.get("FLASHDSA_WITH_CUDA", "1") == "0":
        return False
    if shutil.which("nvcc"):
        return True
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return (Path(cuda_home) / "bin" / "nvcc").exists()


class CMakeBuildExt(build_ext):
    """Configures the CMake project with the torch extension on, builds `flashdsa_torch`, and
    copies the module where setuptools expects it."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(os.environ.get("FLASHDSA_BUILD_DIR", ROOT / "build")).resolve()
        with_cuda = _cuda_enabled()
        print(f"flashdsa: CMake build in {build_dir} (CUDA {'on' if with_cuda else 'off'})")
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DFLASHDSA_BUILD_TORCH=ON",
                     f"-DFLASHDSA_WITH_CUDA={'ON' if with_cuda else 'OFF'}", f"-DFLASHDSA_PYTHON={sys.executable}"]
        if not (build_dir / "CMakeCache.txt").exists():
            configure += ["-DCMAKE_BUILD_TYPE=Release"] + (["-G", "Ninja"] if shutil.which("ninja") else [])
        if with_cuda and not shutil.which("nvcc") and (Path("/usr/local/cuda/bin/nvcc")).exists():
            configure.append("-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
        subprocess.check_call(configure)
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "flashdsa_torch", "-j", jobs])
        built = sorted((build_dir / "python" / "flashdsa").glob("_C*"))
        if len(built) != 1:
            raise RuntimeError(f"flashdsa: expected one built _C module in {build_dir}/python/flashdsa, found {built}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="flashdsa",
    version=VERSION["__version__"],
    description="Fused DeepSeek Sparse Attention (DSA) training kernels for Hopper, with a PyTorch front end",
    package_dir={"": "python"},
    packages=["flashdsa", "flashdsa.megatron"],
    ext_modules=[Extension("flashdsa._C", sources=[])],
    cmdclass={"build_ext": CMakeBuildExt},
    python_requires=">=3.10",
    install_requires=["torch>=2.5"],
    # Megatron Core backend (flashdsa.megatron, docs/megatron.md). megatron-core 0.19.2 declares
    # Python >= 3.12; on 3.11 install it with `pip install --ignore-requires-python` (scripts/install.sh).
    extras_require={"megatron": ["megatron-core==0.19.2"]},
)

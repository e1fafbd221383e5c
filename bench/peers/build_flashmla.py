#!/usr/bin/env python3
"""Builds bench/peers/flashmla_binding.cpp with FlashMLA's SM90 sparse prefill kernel (phase1_k576.cu)
from a FlashMLA source tree (FlashMLA + CUTLASS headers at its pinned commit), into DEST/build/.

    python bench/peers/build_flashmla.py --src /tmp/peers/flashmla/src --dest /tmp/peers/flashmla

Run on the GPU machine (scripts/peers_gpu.sh does); needs nvcc (CUDA >= 12.3 for sm_90a) and ninja.
The flags follow FlashMLA's setup.py for its SM90 kernels. Prints the ptxas register / spill lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "flashdsa_peer_flashmla"
KERNEL = "csrc/sm90/prefill/sparse/instantiations/phase1_k576.cu"
# The HAVE_TOPK_LENGTH instantiation (topk_length argument; Megatron's cudnn backend passes it): built
# when the source tree has it.
KERNEL_TOPKLEN = "csrc/sm90/prefill/sparse/instantiations/phase1_k576_topklen.cu"

NVCC_FLAGS = [
    "-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "--use_fast_math", "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills",
    "-gencode", "arch=compute_90a,code=sm_90a",
]


def include_dirs(src: Path) -> list:
    """FlashMLA's include folders (as its setup.py lists them)."""
    return [str(src / "csrc"), str(src / "csrc" / "kerutils" / "include"), str(src / "csrc" / "sm90"),
            str(src / "csrc" / "cutlass" / "include"), str(src / "csrc" / "cutlass" / "tools" / "util" / "include")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, required=True, help="FlashMLA source tree (with csrc/cutlass/include)")
    p.add_argument("--dest", type=Path, required=True, help="output folder; the library goes to DEST/build/")
    args = p.parse_args(argv)
    kernel = args.src / KERNEL
    if not kernel.is_file():
        print(f"build_flashmla: {kernel} not found", file=sys.stderr)
        return 2
    if not (args.src / "csrc" / "cutlass" / "include" / "cute").is_dir():
        print(f"build_flashmla: no CUTLASS headers in {args.src / 'csrc' / 'cutlass' / 'include'}", file=sys.stderr)
        return 2
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    from torch.utils import cpp_extension
    build = args.dest / "build"
    build.mkdir(parents=True, exist_ok=True)
    start = time.time()
    sources = [str(HERE / "flashmla_binding.cpp"), str(kernel)]
    defines = []
    if (args.src / KERNEL_TOPKLEN).is_file():
        sources.append(str(args.src / KERNEL_TOPKLEN))
        defines.append("-DFLASHDSA_PEER_FLASHMLA_TOPKLEN")
    cpp_extension.load(name=NAME, sources=sources,
                       extra_include_paths=include_dirs(args.src),
                       extra_cflags=["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations"] + defines,
                       extra_cuda_cflags=NVCC_FLAGS + ["--threads", os.environ.get("NVCC_THREADS", "8")],
                       build_directory=str(build), is_python_module=False, verbose=True)
    print(f"build_flashmla: built {build / (NAME + '.so')} in {time.time() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

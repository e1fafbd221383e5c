"""Writes the torch build settings CMake needs for the flashdsa._C extension as a CMake script.

    python cmake/torch_info.py OUT.cmake {cpu|cuda}

The same settings torch.utils.cpp_extension uses: include and library directories, the C++ ABI
flag, and this interpreter's extension suffix and Python.h directory.
"""

import sys
import sysconfig

import torch
from torch.utils import cpp_extension


def main() -> None:
    out, device = sys.argv[1], sys.argv[2]
    values = {
        "FLASHDSA_TORCH_INCLUDE_DIRS": ";".join(cpp_extension.include_paths(device)),
        "FLASHDSA_TORCH_LIBRARY_DIRS": ";".join(cpp_extension.library_paths(device)),
        "FLASHDSA_TORCH_CXX11_ABI": str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
        "FLASHDSA_TORCH_VERSION": torch.__version__,
        "FLASHDSA_PYTHON_INCLUDE_DIR": sysconfig.get_paths()["include"],
        "FLASHDSA_PYTHON_EXT_SUFFIX": sysconfig.get_config_var("EXT_SUFFIX"),
    }
    with open(out, "w") as f:
        for name, value in values.items():
            f.write(f'set({name} "{value}")\n')


if __name__ == "__main__":
    main()

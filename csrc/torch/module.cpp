// The Python module `flashdsa._C`. It has no Python-level members: importing it loads the library,
// whose static initializers register the torch.ops.flashdsa.* ops (csrc/torch/ops.cpp).
#include <Python.h>

PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "FlashDSA torch ops (torch.ops.flashdsa)", -1,
      nullptr /* methods */, nullptr /* slots */, nullptr /* traverse */, nullptr /* clear */, nullptr /* free */};
  return PyModule_Create(&module_def);
}

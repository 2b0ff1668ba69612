"""Print the path of the ONNX Runtime shared library shipped in the onnxruntime wheel."""

import glob
import os
import sys

import onnxruntime

capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
libs = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so*")))
if not libs:
    sys.exit(f"no libonnxruntime.so* in {capi}")
print(libs[-1])

"""Print the directory holding NVRTC from its wheel: libnvrtc.so.13 from nvidia-cuda-nvrtc (the
default), or with `--cuda 12` libnvrtc.so.12 from nvidia-cuda-nvrtc-cu12. CI puts it on
LD_LIBRARY_PATH so cuda-engine's unit test compiles every kernel module without a GPU, with
the NVRTC of the build under test (the cuda-13 or the cuda-12 feature)."""

import argparse
import glob
import os
import sys

import nvidia

WHEEL_LIBS = {
    "13": os.path.join("cu13", "lib", "libnvrtc.so.13"),
    "12": os.path.join("cuda_nvrtc", "lib", "libnvrtc.so.12"),
}

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--cuda", choices=sorted(WHEEL_LIBS), default="13", help="CUDA major version")
wanted = WHEEL_LIBS[parser.parse_args().cuda]
for root in nvidia.__path__:
    libs = glob.glob(os.path.join(root, wanted))
    if libs:
        print(os.path.dirname(libs[0]))
        sys.exit(0)
sys.exit(f"no {wanted} under {list(nvidia.__path__)}")

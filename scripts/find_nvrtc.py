"""Print the directory holding libnvrtc.so.13 from the nvidia-cuda-nvrtc wheel (CI puts it on
LD_LIBRARY_PATH so cuda-engine's unit test compiles every kernel module without a GPU)."""

import glob
import os
import sys

import nvidia

for root in nvidia.__path__:
    libs = glob.glob(os.path.join(root, "cu13", "lib", "libnvrtc.so.13"))
    if libs:
        print(os.path.dirname(libs[0]))
        sys.exit(0)
sys.exit(f"no cu13/lib/libnvrtc.so.13 under {list(nvidia.__path__)}")

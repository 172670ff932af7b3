"""STAND-IN op schemas for torchvision, installed by stackproof's recipe sglang-cpu-standins as
site-packages/_stackproof_standin_torchvision_ops.py (loaded through a .pth file). NOT upstream.

`import sglang` imports torchvision (srt/utils/common.py:95 in sglang 0.5.18). PyPI's torchvision
0.28.0 is CUDA-linked: its `_C` needs libtorch_cuda.so and libc10_cuda.so, so next to the CPU torch
it does not load, and torchvision's `_meta_registrations` then dies on
`register_fake("torchvision::nms")` ("operator torchvision::nms does not exist"). Defining the
schemas of the two ops registered unconditionally (nms, qnms) lets `import torchvision` succeed;
the ops stay unimplemented (calling one raises). The schemas are defined the first time
torchvision is imported, so no other interpreter start pays for `import torch`.
"""

import contextlib
import sys


class _DefineOnFirstImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _define()
        return None  # the normal finders import torchvision itself


def _define() -> None:
    global _LIB
    import torch

    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        with contextlib.suppress(RuntimeError):  # a torchvision whose _C did load has them already
            _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


sys.meta_path.insert(0, _DefineOnFirstImport())

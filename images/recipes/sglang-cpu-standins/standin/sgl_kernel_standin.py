"""STAND-IN for SGLang's kernel package (`sgl_kernel`), installed by stackproof's recipe
sglang-cpu-standins as site-packages/sgl_kernel/__init__.py. It is NOT the kernel package.

SGLang's CPU engine imports the CPU build of its kernel package at import time (e.g.
`from sgl_kernel import copy_all_layer_kv_cache_cpu`, kernels/ops/kvcache/cache_move.py:9-10 in
sglang 0.5.18), and no registry reachable here has that build: no CPU wheel, no sdist, in any
version. On a CPU without AMX the layers take their torch-native branches and call no kernel, so
an import stand-in is enough to serve. Every attribute is a function that raises
NotImplementedError and says so on stderr first: a run that ever calls a kernel fails loudly, and
the cell's log rule `no-kernel-stand-in-called` fails the startup stage on that line.
"""

import sys

__version__ = "0.0.0+stackproof.standin"
STANDIN = True


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _kernel(*args, **kwargs):
        message = f"sgl_kernel stand-in: {name} called; this image has no SGLang kernel package"
        print(message, file=sys.stderr, flush=True)
        raise NotImplementedError(message)

    _kernel.__name__ = name
    _kernel.__qualname__ = name
    return _kernel

"""Install the two STAND-INS of this recipe into the interpreter's site-packages (see steps.j2)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent / "standin"


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    kernel = site / "sgl_kernel"
    if kernel.exists():
        raise SystemExit(f"{kernel} exists: a real kernel package is installed, no stand-in needed")
    kernel.mkdir()
    shutil.copyfile(HERE / "sgl_kernel_standin.py", kernel / "__init__.py")
    shutil.copyfile(HERE / "torchvision_ops_standin.py", site / "_stackproof_standin_torchvision_ops.py")
    (site / "zz_stackproof_standin_torchvision_ops.pth").write_text("import _stackproof_standin_torchvision_ops\n")
    print(f"stand-ins installed in {site}: sgl_kernel/ (import stand-in), torchvision op schemas (.pth)")


if __name__ == "__main__":
    main()

"""Two planted faults on the GPU cell in docker, each ending in a receipt (issue 40, item 4).

    python benchmarks/gpu_docker/faults.py stall|kill --matrix matrix.gpu.yaml --out DIR [--compile-cache DIR]

- `stall`: the cell's built image plus the test-only stall recipe (tests/recipes/stall: while
  /tmp/stackproof-stall exists, EngineCore's step parks in `_stackproof_test_stall`), a derived
  image tagged `stackproof/gpu-docker-stall:*` and named so in the receipt. Once the load is under
  way the flag is made inside the server's container (`docker exec`): the watchdog must name
  ENGINE_STALL_API_ALIVE and py-spy must take the engine's frame inside the container.
- `kill`: the cell's own image. Once the load is under way EngineCore is SIGKILLed inside the
  container (tests/faults.py, by its process title): the load stage must name the engine's death,
  not HTTP 5xx.
The verification itself is the project's own (`stackproof.runjob`), stages startup and load; only
the fault is added from outside, by a thread watching the run's server.log for load traffic.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CELL = "gpu-docker-vllm-0.26.0-tiny"
RECIPE = REPO / "tests" / "recipes" / "stall"
SITE_PACKAGES = "/opt/torch/.venv/lib/python3.12/site-packages"  # the base's venv (the host tree)
LOAD_REQUESTS_BEFORE_FAULT = 20


def _docker(*argv: str, timeout: float = 60) -> str:
    return subprocess.run(["docker", *argv], check=True, capture_output=True, text=True, timeout=timeout).stdout.strip()


def _stall_image(base: str) -> str:
    """The cell's image plus the stall recipe: a COPY on top (seconds); test-only, never a cell's."""
    context = Path(tempfile.mkdtemp(prefix="stall-ctx-"))
    for name in ("stackproof_test_stall.py", "stackproof-test-stall.pth"):
        (context / name).write_bytes((RECIPE / name).read_bytes())
    (context / "Dockerfile").write_text(
        f"FROM {base}\nCOPY stackproof_test_stall.py stackproof-test-stall.pth {SITE_PACKAGES}/\n"
    )
    tag = f"stackproof/gpu-docker-stall:{base.rsplit(':', 1)[-1]}"
    subprocess.run(["docker", "build", "--network", "host", "-q", "-t", tag, str(context)], check=True, timeout=300)
    return tag


def _server_container(cell_id: str) -> str | None:
    labels = (f"label=io.stackproof.cell={cell_id}", "label=io.stackproof.role=server")
    found = _docker("ps", "-q", "--filter", labels[0], "--filter", labels[1])
    return found.splitlines()[0] if found else None


def _load_requests(out: Path) -> int:
    return sum(p.read_text(errors="replace").count("POST /v1/") for p in out.rglob("server.log"))


def _inject(mode: str, out: Path, log: list[str], stop: threading.Event) -> None:
    """Wait for load traffic (the startup's completion is one request), then plant the fault once."""
    deadline = time.monotonic() + 540
    while not stop.is_set() and time.monotonic() < deadline:
        container = _server_container(CELL)
        if container and _load_requests(out) >= LOAD_REQUESTS_BEFORE_FAULT:
            if mode == "stall":
                _docker("exec", container, "touch", "/tmp/stackproof-stall")
                made = _load_requests(out)
                log.append(f"{time.time():.3f} stall flag made in {container[:12]} after {made} requests")
            else:
                from pipeline.docker.client import Docker
                from tests.faults import signal_engine_core

                pids = signal_engine_core(Docker.connect(), container, signal.SIGKILL)
                log.append(f"{time.time():.3f} SIGKILL to EngineCore pids {pids} (in-container) in {container[:12]}")
            return
        time.sleep(0.5)
    log.append("no fault planted: the load never reached the server")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("stall", "kill"))
    parser.add_argument("--matrix", type=Path, default=REPO / "matrix.gpu.yaml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compile-cache", type=Path, default=None)
    args = parser.parse_args()

    from pipeline.build.image import built_image
    from pipeline.docker.client import Docker
    from pipeline.matrix.read import load_matrix
    from pipeline.matrix.site import load_site
    from stackproof.compilecompare import use_compile_cache
    from stackproof.runjob import _verify_with_receipt

    use_compile_cache(args.compile_cache)
    images = args.matrix.resolve().parent / "images"
    matrix = load_matrix(args.matrix, images_dir=images)
    cell = matrix.cell(CELL)
    docker = Docker.connect()
    plan, _image = built_image(docker, matrix, cell, load_site(matrix), images)
    tag = _stall_image(plan.tag) if args.mode == "stall" else plan.tag
    image_id = _docker("image", "inspect", "-f", "{{.Id}}", tag)
    assert cell.serve is not None
    load = cell.serve.load
    if args.mode == "stall":  # enough questions that the stall lands mid-load; the watchdog's window
        import dataclasses

        load = dataclasses.replace(load, questions=400, stall_seconds=20)
    log: list[str] = []
    stop = threading.Event()
    injector = threading.Thread(target=_inject, args=(args.mode, args.out, log, stop), daemon=True)
    injector.start()
    started = time.time()
    try:
        receipt = _verify_with_receipt(
            docker,
            matrix,
            cell,
            image=tag,
            image_id=image_id,
            base_ref=plan.base_ref,
            stages=("startup", "load"),
            arm=None,
            out_dir=args.out / args.mode,
            previous=None,
            load=load,
        )
    finally:
        stop.set()
        if args.mode == "stall":
            subprocess.run(["docker", "rmi", tag], capture_output=True, timeout=120)
    print("\n".join(log))
    print(f"{args.mode}: receipt {receipt.status} in {time.time() - started:.0f} s; image {tag} ({image_id[:19]})")
    left = _docker("ps", "-aq", "--filter", f"label=io.stackproof.cell={CELL}")
    print(f"containers left for the cell: {len(left.split()) if left else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

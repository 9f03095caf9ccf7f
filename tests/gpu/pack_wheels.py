"""Pack what tests/gpu/check_learner_gpu.py needs beyond torch, transformers and numpy into
``tests/gpu/wheels`` (git-ignored), for a GPU machine without network (Python 3.12, x86_64):

    python tests/gpu/pack_wheels.py [--out DIR] [--python 3.12]

DeepSpeed is built here as a pure-Python wheel (``pip wheel --no-deps``: its ops are JIT-built
where used, and the learner uses none: the optimizer is torch's AdamW); its small dependencies
come as binary wheels for the target Python. Prints each wheel's size and the total, and exits
1 if the total is 60 MB or more (what one run may carry). On the GPU machine:

    pip install --no-index --find-links tests/gpu/wheels deepspeed
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEEPSPEED = "deepspeed==0.19.8"  # pyproject.toml's floor: ZeRO-3 skips non-finite bf16 steps
# DeepSpeed's requirements, less torch and numpy (on the machine); pydantic's own come along
DEPENDENCIES = ["einops", "hjson", "msgpack", "ninja", "packaging", "psutil", "py-cpuinfo",
                "pydantic", "tqdm"]  # fmt: skip
LIMIT_MB = 60.0


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "wheels")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(args.out), DEEPSPEED)
    abi = "cp" + args.python.replace(".", "")
    pip("download", "--dest", str(args.out), "--only-binary=:all:", "--python-version",
        args.python, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
        "--platform", "any", *DEPENDENCIES)  # fmt: skip
    total = 0.0
    for wheel in sorted(args.out.glob("*.whl")):
        mb = wheel.stat().st_size / 1e6
        total += mb
        print(f"{mb:8.2f} MB  {wheel.name}")
    print(f"{total:8.2f} MB  in all ({'under' if total < LIMIT_MB else 'OVER'} {LIMIT_MB:.0f} MB)")
    return 0 if total < LIMIT_MB else 1


if __name__ == "__main__":
    sys.exit(main())

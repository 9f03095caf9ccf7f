"""Pack what the GPU checks need beyond torch, transformers and numpy into ``tests/gpu/wheels``
(git-ignored), for a GPU machine without network (Python 3.12, x86_64):

    python tests/gpu/pack_wheels.py [--out DIR] [--python 3.12] [--limit-mib 40]

Part A (check_learner_gpu.py) needs DeepSpeed; Part C (check_train_gpu.py, a whole
``launch.train``) also Ray and Hydra. DeepSpeed and antlr4 (Hydra's parser runtime, an sdist)
are built here as pure-Python wheels (``pip wheel --no-deps``: DeepSpeed's ops are JIT-built
where used, and the learner uses none: the optimizer is torch's AdamW); everything else comes
as binary wheels for the target Python. Packages that torch and transformers already need
(``IN_IMAGE``) are left out: a machine where those two work has them.

Ray's wheel (79 MB) is repacked without what a local ``ray.init(include_dashboard=False)`` and
the run's actors never load (:data:`RAY_DROP`: its Java jar, the dashboard's web client, the
libraries on top of Ray), its three native programs stripped of their symbol tables (``strip``;
the dynamic symbols stay) and LZMA-compressed (Python's zipfile, and so pip, reads it: 12 MB
less than deflate). Prints each wheel's size and the total; exits 1 if the total is over
``--limit-mib`` (what one GPU run may carry beside the repository). On the GPU machine
(tests/gpu/run_gpu_checks.sh):

    pip install --no-index --no-deps --target /tmp/site tests/gpu/wheels/*.whl
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAY = "ray==2.60.0"  # what the CPU stack runs (constraints-cpu.txt)
# sdists, built here (pure Python); DeepSpeed: pyproject.toml's floor (ZeRO-3 skips non-finite
# bf16 steps); antlr4 4.9.3: the only runtime hydra-core 1.3 accepts (no wheel on the index)
PURE = ["deepspeed==0.19.8", "antlr4-python3-runtime==4.9.3"]
BINARY = [
    # DeepSpeed's requirements, less torch and numpy; pydantic's own come along
    "einops", "hjson", "msgpack", "ninja", "psutil", "py-cpuinfo", "pydantic",
    # Ray's (less the IN_IMAGE ones); jsonschema's and requests' own come along
    "jsonschema", "protobuf", "requests",
    # Hydra's
    "hydra-core==1.3.8", "omegaconf==2.3.1",
]  # fmt: skip
# what torch (filelock, typing-extensions) and transformers (packaging, pyyaml, tqdm; click
# through typer) require: present wherever they run, and a second copy on PYTHONPATH would
# shadow the machine's own
IN_IMAGE = {"click", "filelock", "packaging", "pyyaml", "tqdm", "typing-extensions"}
RAY_DROP = (
    "ray/jars/",  # Java workers (32 MB)
    "ray/dashboard/client/",  # the dashboard's web page (include_dashboard=False)
    # libraries on top of Ray; ray.init and the run's actors import none of them
    "ray/air/", "ray/data/", "ray/llm/", "ray/rllib/", "ray/serve/", "ray/train/", "ray/tune/",
    "ray/workflow/", "ray/util/dask/", "ray/util/spark/", "ray/util/xgboost/",
    "ray/util/lightgbm/", "ray/util/horovod/", "ray/util/joblib/", "ray/util/sgd/",
)  # fmt: skip
RAY_NATIVE = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
MIB = 2**20


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def record_line(name: str, data: bytes) -> str:
    """A wheel RECORD row: ``name,sha256=<urlsafe b64, unpadded>,size``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim_wheel(src: Path, dst: Path, drop: tuple[str, ...], native: tuple[str, ...] = ()) -> dict:
    """Repack the wheel ``src`` into ``dst`` without the files under ``drop`` (path prefixes),
    with each file of ``native`` stripped (``strip``, where installed) and LZMA-compressed, the
    rest deflated, and its RECORD rewritten for what is kept. Returns counts and sizes."""
    kept, dropped, stripped = [], 0, []
    with zipfile.ZipFile(src) as z, tempfile.TemporaryDirectory() as tmp:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        with zipfile.ZipFile(dst, "w") as out:
            for info in z.infolist():
                name = info.filename
                if name == record or name.endswith("/"):
                    continue
                if name.startswith(drop):
                    dropped += 1
                    continue
                data = z.read(name)
                method = zipfile.ZIP_DEFLATED
                if name in native:
                    data, did = _stripped(data, Path(tmp) / "native")
                    stripped += [name] if did else []
                    method = zipfile.ZIP_LZMA
                entry = zipfile.ZipInfo(name, date_time=info.date_time)
                entry.external_attr = info.external_attr  # keeps the programs executable
                out.writestr(entry, data, compress_type=method, compresslevel=9)
                kept.append(record_line(name, data))
            out.writestr(record, "\n".join([*kept, f"{record},,"]) + "\n", zipfile.ZIP_DEFLATED)
    sizes = {"mib_before": src.stat().st_size / MIB, "mib_after": dst.stat().st_size / MIB}
    return {"kept": len(kept), "dropped": dropped, "stripped": stripped, **sizes}


def _stripped(data: bytes, scratch: Path) -> tuple[bytes, bool]:
    """``data`` without its symbol table when ``strip`` is installed and takes it."""
    if not data.startswith(b"\x7fELF") or shutil.which("strip") is None:
        return data, False
    scratch.write_bytes(data)
    if subprocess.run(["strip", str(scratch)], capture_output=True).returncode != 0:
        return data, False
    return scratch.read_bytes(), True


def distribution(wheel: Path) -> str:
    """The normalised project name of a wheel file (``PyYAML-6.0...whl`` -> ``pyyaml``)."""
    return wheel.name.split("-")[0].lower().replace("_", "-").replace(".", "-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "wheels")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    ap.add_argument("--limit-mib", type=float, default=40.0, help="the most the pack may weigh")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(args.out), *PURE)
    abi = "cp" + args.python.replace(".", "")
    target = ["--only-binary=:all:", "--python-version", args.python, "--implementation", "cp",
              "--abi", abi, "--abi", "abi3", "--abi", "none", "--platform", "manylinux2014_x86_64",
              "--platform", "manylinux_2_28_x86_64", "--platform", "any"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--no-deps", "--dest", tmp, *target, RAY)
        (ray,) = Path(tmp).glob("ray-*.whl")
        trimmed = trim_wheel(ray, args.out / ray.name, RAY_DROP, RAY_NATIVE)
    # the pure wheels' requirements are in BINARY (antlr4 is found among the built ones)
    pip("download", "--dest", str(args.out), "--find-links", str(args.out), *target, *BINARY)
    for wheel in args.out.glob("*.whl"):
        if distribution(wheel) in IN_IMAGE:
            wheel.unlink()
    print(
        f"ray: {trimmed['mib_before']:.2f} -> {trimmed['mib_after']:.2f} MiB "
        f"({trimmed['dropped']} files dropped, {len(trimmed['stripped'])} programs stripped)"
    )
    total = 0.0
    for wheel in sorted(args.out.glob("*.whl")):
        mib = wheel.stat().st_size / MIB
        total += mib
        print(f"{mib:8.2f} MiB  {wheel.name}")
    ok = total <= args.limit_mib
    print(f"{total:8.2f} MiB  in all ({'within' if ok else 'OVER'} {args.limit_mib:g} MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

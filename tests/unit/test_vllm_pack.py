"""tests/gpu/pack_vllm.py offline: the parts and their manifest, what the GPU machine's
installer says of a missing or damaged part, the wheel's repacking, and the cut of CUDA code to
compute capability 9.0 on a fat binary built here byte by byte."""

from __future__ import annotations

import csv
import io
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu import pack_vllm as pv

ROOT = Path(__file__).resolve().parents[2]


def bundle_of(tmp_path: Path, size: int) -> Path:
    path = tmp_path / pv.BUNDLE
    path.write_bytes(bytes((i * 7 + i // 251) % 256 for i in range(size)))
    return path


def test_parts_join_back_to_the_bundle_and_the_manifest_names_each(tmp_path):
    bundle = bundle_of(tmp_path, 2500)
    out = tmp_path / "pack"
    out.mkdir()
    manifest = pv.split(bundle, out, 1000)
    assert [p["size"] for p in manifest["parts"]] == [1000, 1000, 500]
    assert [p["name"] for p in manifest["parts"]] == [f"{pv.BUNDLE}.part0{i}" for i in (1, 2, 3)]
    assert json.loads((out / pv.MANIFEST).read_text()) == manifest
    assert manifest["sha256"] == pv.sha256(bundle) and manifest["size"] == 2500
    assert pv.check(out)[1] == []
    dest = tmp_path / "joined"
    dest.mkdir()
    assert pv.join(out, dest).read_bytes() == bundle.read_bytes()


def test_a_missing_or_damaged_part_is_named(tmp_path):
    out = tmp_path / "pack"
    out.mkdir()
    pv.split(bundle_of(tmp_path, 2500), out, 1000)
    (out / f"{pv.BUNDLE}.part02").unlink()
    third = out / f"{pv.BUNDLE}.part03"
    third.write_bytes(b"x" + third.read_bytes()[1:])
    problems = pv.check(out)[1]
    assert problems == [f"missing: {pv.BUNDLE}.part02 (1000 bytes)",
                        f"wrong sha256: {pv.BUNDLE}.part03"]  # fmt: skip
    with pytest.raises(ValueError, match="missing: vllm_pack.zip.part02"):
        pv.join(out, tmp_path)
    assert pv.main(["--check", str(out)]) == 1
    assert pv.install(out, tmp_path / "site") == 1 and not (tmp_path / "site").exists()


def fake_wheel(tmp_path: Path) -> Path:
    """A wheel as vLLM's is laid out: a dropped library, a file name with commas."""
    src = tmp_path / "vllm-9.9-py3-none-any.whl"
    files = {
        "vllm/__init__.py": "VERSION = 9\n",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "not for Hopper",
        "vllm/configs/E=1,N=14336,device_name=H100.json": "{}\n",
        "vllm-9.9.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9\n",
        "vllm-9.9.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }  # fmt: skip
    with zipfile.ZipFile(src, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("vllm-9.9.dist-info/RECORD", "")
    return src


def test_the_repacked_wheel_installs_offline_from_its_parts(tmp_path):
    """repack drops what DROP names, LZMA-compresses the rest and writes RECORD as csv (vLLM's
    file names hold commas); the parts, joined and checked on the GPU machine's side, install
    with pip offline into a --target folder."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    dst = wheels / "vllm-9.9-py3-none-any.whl"
    src = fake_wheel(tmp_path)
    assert not pv.repacked(src)
    got = pv.repack(src, dst, tuple(pv.DROP))
    assert got["dropped"] == 1 and got["kept"] == 4 and pv.repacked(dst)
    with zipfile.ZipFile(dst) as z:
        assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" not in z.namelist()
        assert z.getinfo("vllm/__init__.py").compress_type == zipfile.ZIP_LZMA
        rows = list(csv.reader(io.StringIO(z.read("vllm-9.9.dist-info/RECORD").decode())))
        assert {r[0] for r in rows} == set(z.namelist())
        comma = "vllm/configs/E=1,N=14336,device_name=H100.json"
        assert [r for r in rows if r[0] == comma] == [pv.record_row(comma, b"{}\n")]
    bundle = tmp_path / pv.BUNDLE
    with zipfile.ZipFile(bundle, "w") as z:
        z.write(dst, dst.name)
    pack = tmp_path / "pack"
    pack.mkdir()
    pv.split(bundle, pack, 700)
    assert len(json.loads((pack / pv.MANIFEST).read_text())["parts"]) >= 2
    assert pv.install(pack, tmp_path / "site") == 0
    assert (tmp_path / "site" / "vllm" / "__init__.py").read_text() == "VERSION = 9\n"
    assert (tmp_path / "site" / "vllm" / "configs" / "E=1,N=14336,device_name=H100.json").exists()


# ---- the CUDA code cut to 9.0 -----------------------------------------------------------------


def entry(kind: int, arch: int, payload: bytes) -> bytes:
    """A fat binary entry: kind u16, version u16, header size u32, payload size u64, then
    fields up to the architecture (u32 at +28), padded to a 64-byte header."""
    head = struct.pack("<HHIQ", kind, 0x101, 64, len(payload))
    head += struct.pack("<IIII", len(payload), 0, 0x10008, arch)
    return head + bytes(64 - len(head)) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", pv.FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with(section: bytes) -> bytes:
    """A 64-bit ELF holding ``section`` as .nv_fatbin (only what the section lookup reads)."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    data_at, names_at = 64, 64 + len(section)
    shoff = names_at + len(names)
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    sections = bytes(64)  # the null section
    sections += struct.pack("<IIQQQQ", 1, 3, 0, 0, names_at, len(names)) + bytes(24)
    sections += struct.pack("<IIQQQQ", 11, 1, 2, 0, data_at, len(section)) + bytes(24)
    return bytes(header) + section + names + sections


SM80, SM90, SM100, PTX80, PTX90 = (
    entry(pv.CUBIN, 80, b"a" * 40), entry(pv.CUBIN, 90, b"b" * 24), entry(pv.CUBIN, 100, b"c" * 56),
    entry(pv.PTX, 80, b"d" * 32), entry(pv.PTX, 90, b"e" * 16),
)  # fmt: skip


def entries_of(elf: bytes) -> list[list[bytes]]:
    """Each fat binary's entries, as bytes, read back through its header."""
    at, size = pv._section(elf, ".nv_fatbin")
    end, found = at + size, []
    while at < end:
        if struct.unpack_from("<I", elf, at)[0] != pv.FATBIN_MAGIC:
            at += 8
            continue
        total, entries = pv.fatbin_entries(elf, at)
        pos, got = at + 16, []
        for _, _, n in entries:
            got.append(elf[pos : pos + n])
            pos += n
        found.append(got)
        at += total
    return found


def test_fat_binaries_keep_what_a_9_0_device_loads():
    """Where a 9.0 cubin exists only it stays (the driver never JIT-compiles PTX then); where
    none does, the PTX of 9.0 and below stays; a fat binary with nothing for 9.0 keeps its
    smallest entry. Every fat binary stays where it was, with zeros behind what it keeps."""
    section = fatbin(SM80, SM90, SM100, PTX80, PTX90) + fatbin(PTX80, SM100, PTX90)
    section += fatbin(SM100, SM80)
    elf = elf_with(section)
    cut, stats = pv.hopper_fatbin(elf)
    assert len(cut) == len(elf) and cut[:64] == elf[:64]
    assert entries_of(cut) == [[SM90], [PTX80, PTX90], [SM80]]
    assert stats == {"fatbins": 3, "entries": 10, "kept": 4,
                     "bytes_before": len(section) - 48,
                     "bytes_after": len(SM90) + len(PTX80) + len(PTX90) + len(SM80)}  # fmt: skip
    second = 64 + len(fatbin(SM80, SM90, SM100, PTX80, PTX90))
    assert struct.unpack_from("<I", cut, second)[0] == pv.FATBIN_MAGIC  # not moved
    first_end = 64 + 16 + len(SM90)
    assert set(cut[first_end:second]) == {0}
    assert pv.hopper_fatbin(cut)[0] == cut  # cut once, nothing more to cut


def test_an_elf_without_cuda_code_is_left_alone():
    plain = elf_with(b"")
    plain = plain.replace(b".nv_fatbin", b".rodata\0\0\0")
    assert pv.hopper_fatbin(plain) == (plain, pv.hopper_fatbin(plain)[1])
    assert pv.hopper_fatbin(plain)[1]["fatbins"] == 0


def test_the_pack_lists_are_consistent():
    """Nothing the image has is packed, the dependencies are pinned, and nothing left out is
    also packed; DROP never drops vLLM's own libraries that a Hopper run loads."""
    names = {pv.normalise(d.split("==")[0]) for d in pv.DEPS}
    assert not names & pv.IMAGE and all("==" in d for d in pv.DEPS)
    left_out = {pv.normalise(n) for group in pv.LEFT_OUT.values() for n in group}
    assert not names & left_out
    for kept in (
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/cumem_allocator.abi3.so",
        "vllm/vllm_flash_attn/flash_attn_interface.py",
    ):
        assert not kept.startswith(tuple(pv.DROP))  # fmt: skip
    assert {"torch", "transformers", "numpy", "triton"} <= pv.IMAGE


def test_check_runs_as_a_script_on_the_gpu_machine(tmp_path):
    """There it runs as ``python3 tests/gpu/pack_vllm.py --check DIR`` (no package import)."""
    out = tmp_path / "pack"
    out.mkdir()
    pv.split(bundle_of(tmp_path, 300), out, 100)
    (out / f"{pv.BUNDLE}.part03").unlink()
    run = subprocess.run([sys.executable, "tests/gpu/pack_vllm.py", "--check", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "2 of 3 parts ready" in run.stdout and f"missing: {pv.BUNDLE}.part03" in run.stdout

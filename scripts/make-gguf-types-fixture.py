#!/usr/bin/env python3
"""Writes tests/fixtures/gguf-types/all-types.gguf and its oracle all-types.json with the `gguf`
package (llama.cpp's own GGUF writer and reader).

The GGUF holds one small tensor of every ggml type the package knows (IQ4_NL, IQ4_XS, MXFP4 and
the others candle 0.11.1 cannot read) plus metadata of every value type. The JSON records what
the package's reader sees (each tensor's type id, shape, offset and byte count, the data offset)
and the package's type table (block size, bytes per block), so ferry's own header reader and type
table are checked against an independent implementation. The bytes are deterministic: rerunning
the script rewrites the same files.

Run: /work/venv-oracle/bin/python scripts/make-gguf-types-fixture.py
"""
import json
import pathlib

import numpy as np
from gguf import GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf-types"
PLAIN = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "all-types.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_int32("test.i32", -7)
    writer.add_uint64("test.u64", 1 << 40)
    writer.add_float32("test.f32", 0.5)
    writer.add_float64("test.f64", -2.25)
    writer.add_bool("test.bool", True)
    writer.add_string("test.string", "héllo")
    writer.add_array("test.strings", ["a", "bc", ""])
    writer.add_array("test.ints", [1, 2, 3])
    rng = np.random.default_rng(7)
    for ty in GGMLQuantizationType:
        block, size = GGML_QUANT_SIZES[ty]
        name = f"t.{ty.name.lower()}"
        if ty in PLAIN:
            data = (rng.standard_normal((2, 3)) * 10).astype(PLAIN[ty])
            writer.add_tensor(name, data)
        elif ty == GGMLQuantizationType.BF16:
            # bf16 as raw u16 words (the upper halves of f32 values).
            words = (rng.standard_normal((2, 4)).astype(np.float32).view(np.uint32) >> 16)
            writer.add_tensor(name, words.astype(np.uint16).view(np.uint8), raw_dtype=ty)
        else:
            # Two rows of one block each, as raw bytes (the reader only needs sizes).
            raw = rng.integers(0, 256, size=(2, size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=ty)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = GGUFReader(str(path))
    tensors = [
        {
            "name": t.name,
            "type": int(t.tensor_type),
            # GGUF stores dims fastest first; ferry reports them row-major.
            "shape": [int(d) for d in reversed(t.shape.tolist())],
            "offset": int(t.data_offset) - int(reader.data_offset),
            "bytes": int(t.n_bytes),
        }
        for t in reader.tensors
    ]
    oracle = {
        "data_offset": int(reader.data_offset),
        "alignment": int(reader.alignment),
        "tensors": tensors,
        "types": {
            str(int(ty)): {"name": ty.name, "block": GGML_QUANT_SIZES[ty][0], "bytes": GGML_QUANT_SIZES[ty][1]}
            for ty in GGMLQuantizationType
        },
    }
    (OUT / "all-types.json").write_text(json.dumps(oracle, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes) and all-types.json")


if __name__ == "__main__":
    main()

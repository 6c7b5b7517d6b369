#!/usr/bin/env python3
"""Writes tests/fixtures/iq-quants/blocks.json: random raw blocks of IQ4_NL, IQ4_XS and MXFP4
with their values as dequantized by the `gguf` package (llama.cpp's own Python reference,
`gguf.quants.dequantize`), the independent oracle ferry's decoders and CPU kernels for these
types are tested against (crates/ferry-model/src/cpu_qmatmul/iq_tests.rs).

Each case is a small `[rows, cols]` matrix: `blocks` is its raw GGUF bytes (hex), `values` its
row-major f32 values (hex of the little-endian f32 bytes, so they round-trip exactly). The
scales are drawn from realistic ranges (f16 `d` of a few 1e-3 to 1e-1, E8M0 exponents around
2^-8 .. 2^4 plus the denormal exponents 0 and 1); the 4-bit indices and IQ4_XS's 6-bit
sub-block scales are uniformly random. A fixed seed makes reruns write the same file.

Run: /work/venv-oracle/bin/python scripts/make-iq-fixture.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "iq-quants"


def f16_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = np.exp(rng.uniform(np.log(2e-3), np.log(1e-1), n))
    sign = rng.choice([-1.0, 1.0], n)
    return (mag * sign).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng: np.random.Generator, ty: T, n: int) -> np.ndarray:
    _, size = GGML_QUANT_SIZES[ty]
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if ty in (T.IQ4_NL, T.IQ4_XS):
        raw[:, 0:2] = f16_scales(rng, n)
    elif ty == T.MXFP4:
        e = rng.integers(119, 132, n)
        e[: min(n, 2)] = [0, 1][: min(n, 2)]
        raw[:, 0] = e.astype(np.uint8)
    return raw


def case(rng: np.random.Generator, ty: T, rows: int, cols: int) -> dict:
    block, size = GGML_QUANT_SIZES[ty]
    n = rows * cols // block
    raw = random_blocks(rng, ty, n).reshape(rows, cols // block * size)
    values = dequantize(raw, ty).astype("<f4")
    assert values.shape == (rows, cols), values.shape
    return {
        "type": ty.name,
        "rows": rows,
        "cols": cols,
        "blocks": raw.tobytes().hex(),
        "values": values.tobytes().hex(),
    }


def main() -> None:
    rng = np.random.default_rng(20261201)
    cases = [
        case(rng, T.IQ4_NL, 3, 64),
        case(rng, T.IQ4_XS, 1, 512),
        case(rng, T.MXFP4, 3, 64),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"source": "gguf.quants.dequantize", "cases": cases}, indent=1)
    (OUT / "blocks.json").write_text(text + "\n")


if __name__ == "__main__":
    main()

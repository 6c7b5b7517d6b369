//! `verify_weights`: a check of every tensor a model uses, read once from its mapped file before
//! the model loads. Float tensors (f32, f16, bf16, f64; GGUF or safetensors) must hold only
//! finite numbers; block-quantized GGUF tensors must have finite block scales (each block's
//! f16 `d`, and its `m`/`dmin` where the format has one; MXFP4's exponent byte must not be the
//! NaN code), which is what decides whether their dequantized values are finite, since the
//! quantized codes themselves are small integers. The first bad value fails the load with the
//! tensor's name and the element or block.
//!
//! It catches weights corrupted into NaN or infinity (a failed conversion, a damaged copy):
//! otherwise those are served silently, as NaN logits. It does not catch a flipped bit inside
//! quantized codes (every code is a valid value), and the types whose layout it does not know
//! (IQ1_M, NVFP4, Q1_0, the integer types) are only read. It reads every byte of the weights
//! once (the file's pages come in from the disk if they are not cached), split across rayon's
//! threads.

use half::{bf16, f16};
use rayon::prelude::*;

use super::checkpoint::Checkpoint;
use super::error::{ModelError, Result};
use super::header::GgufType;
use super::tensors::{StoredType, TensorRecord};

/// Checks every tensor of `checkpoint` (see the module docs); `Err` names the first bad one.
pub fn verify_weights(checkpoint: &Checkpoint) -> Result<()> {
    let records: Vec<&TensorRecord> = checkpoint.tensors().records().collect();
    let bad = records
        .par_iter()
        .map(|record| -> Result<Option<String>> {
            Ok(
                first_bad(record.stored, checkpoint.bytes(record)?).map(|at| {
                    format!(
                        "tensor `{}` ({}) holds a non-finite value at {at}",
                        record.name,
                        stored_name(record.stored)
                    )
                }),
            )
        })
        .collect::<Result<Vec<Option<String>>>>()?;
    match bad.into_iter().flatten().next() {
        Some(what) => Err(ModelError::Source(format!(
            "the weights are corrupted (verify_weights): {what}"
        ))),
        None => Ok(()),
    }
}

fn stored_name(stored: StoredType) -> String {
    match stored {
        StoredType::Gguf(ty) => ty.name().to_ascii_lowercase(),
        StoredType::Safetensors(st) => format!("{st:?}").to_ascii_lowercase(),
    }
}

/// Where the first non-finite value of a tensor stored as `stored` in `bytes` is (`element N`
/// or `block N`), if any.
fn first_bad(stored: StoredType, bytes: &[u8]) -> Option<String> {
    let element = |i: Option<usize>| i.map(|i| format!("element {i}"));
    let block = |i: Option<usize>| i.map(|i| format!("block {i}"));
    match stored {
        StoredType::Gguf(GgufType::F32) | StoredType::Safetensors(safetensors::Dtype::F32) => {
            element(position(bytes, 4, |b| {
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()
            }))
        }
        StoredType::Gguf(GgufType::F16) | StoredType::Safetensors(safetensors::Dtype::F16) => {
            element(position(bytes, 2, half_finite))
        }
        StoredType::Gguf(GgufType::BF16) | StoredType::Safetensors(safetensors::Dtype::BF16) => {
            element(position(bytes, 2, |b| {
                bf16::from_le_bytes([b[0], b[1]]).is_finite()
            }))
        }
        StoredType::Gguf(GgufType::F64) | StoredType::Safetensors(safetensors::Dtype::F64) => {
            element(position(bytes, 8, |b| {
                f64::from_le_bytes(b.try_into().unwrap_or([0; 8])).is_finite()
            }))
        }
        StoredType::Gguf(GgufType::MXFP4) => block(position(bytes, 17, |b| b[0] != 0xFF)),
        StoredType::Gguf(GgufType::Q8_K) => block(position(bytes, 292, |b| {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()
        })),
        StoredType::Gguf(ty) => {
            let scales = half_scales(ty)?;
            block(position(bytes, ty.type_size(), |b| {
                scales.iter().all(|&at| half_finite(&b[at..at + 2]))
            }))
        }
        StoredType::Safetensors(_) => None,
    }
}

/// The byte offsets of a block format's f16 scales (`None`: not a format checked here).
fn half_scales(ty: GgufType) -> Option<&'static [usize]> {
    Some(match ty {
        GgufType::Q4_0
        | GgufType::Q5_0
        | GgufType::Q8_0
        | GgufType::IQ4_NL
        | GgufType::IQ4_XS
        | GgufType::IQ2_XXS
        | GgufType::IQ2_XS
        | GgufType::IQ2_S
        | GgufType::IQ3_XXS
        | GgufType::IQ3_S
        | GgufType::IQ1_S => &[0],
        GgufType::Q4_1 | GgufType::Q5_1 | GgufType::Q8_1 | GgufType::Q4_K | GgufType::Q5_K => {
            &[0, 2]
        }
        GgufType::Q2_K => &[80, 82],
        GgufType::Q3_K => &[108],
        GgufType::Q6_K => &[208],
        GgufType::TQ1_0 => &[52],
        GgufType::TQ2_0 => &[64],
        _ => return None,
    })
}

fn half_finite(b: &[u8]) -> bool {
    f16::from_le_bytes([b[0], b[1]]).is_finite()
}

/// The index of the first `size`-byte chunk of `bytes` that is not `ok`, searched in parallel
/// slices of a few thousand chunks.
fn position(bytes: &[u8], size: usize, ok: impl Fn(&[u8]) -> bool + Sync) -> Option<usize> {
    const PER_TASK: usize = 4096;
    bytes
        .par_chunks(size * PER_TASK)
        .enumerate()
        .find_map_first(|(task, slice)| {
            slice
                .chunks_exact(size)
                .position(|chunk| !ok(chunk))
                .map(|i| task * PER_TASK + i)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_and_scales_are_found_where_they_are() {
        let mut f32s: Vec<u8> = [1.0f32, -2.5, 0.0, 7.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_bad(StoredType::Gguf(GgufType::F32), &f32s), None);
        f32s[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(
            first_bad(StoredType::Gguf(GgufType::F32), &f32s).as_deref(),
            Some("element 2")
        );
        let halfs: Vec<u8> = [f16::ONE, f16::INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            first_bad(StoredType::Safetensors(safetensors::Dtype::F16), &halfs).as_deref(),
            Some("element 1")
        );
        // Q4_1 blocks (d, m, 16 bytes of codes): block 5000 (in the second parallel slice) has
        // a NaN `m`.
        let mut q4_1 = vec![0u8; 20 * 6000];
        assert_eq!(first_bad(StoredType::Gguf(GgufType::Q4_1), &q4_1), None);
        q4_1[20 * 5000 + 2..20 * 5000 + 4].copy_from_slice(&f16::NAN.to_le_bytes());
        assert_eq!(
            first_bad(StoredType::Gguf(GgufType::Q4_1), &q4_1).as_deref(),
            Some("block 5000")
        );
        // Q6_K's scale is at the end of its block; codes that look like NaN are fine.
        let mut q6_k = vec![0xFFu8; 210 * 2];
        q6_k[208..210].copy_from_slice(&f16::ONE.to_le_bytes());
        q6_k[418..420].copy_from_slice(&f16::ONE.to_le_bytes());
        assert_eq!(first_bad(StoredType::Gguf(GgufType::Q6_K), &q6_k), None);
        q6_k[418..420].copy_from_slice(&f16::NEG_INFINITY.to_le_bytes());
        assert_eq!(
            first_bad(StoredType::Gguf(GgufType::Q6_K), &q6_k).as_deref(),
            Some("block 1")
        );
        assert_eq!(
            first_bad(StoredType::Gguf(GgufType::MXFP4), &[0xFF; 17]).as_deref(),
            Some("block 0")
        );
        assert_eq!(first_bad(StoredType::Gguf(GgufType::I32), &[0xFF; 8]), None);
    }
}

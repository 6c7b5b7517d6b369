//! [`GgufType`]: every tensor type id a GGUF file can carry (ggml's `ggml_type`), with the block
//! layout that sizes it: elements per block and bytes per block. A tensor of `n` elements takes
//! `n / block_size * type_size` bytes.
//!
//! The numbers are ggml's type table (`ggml.c`'s `type_traits`, mirrored by the `gguf` Python
//! package's `GGML_QUANT_SIZES`). candle 0.11.1 knows only some of these types
//! ([`GgufType::to_candle`]); ferry reads every file's header itself so that sizing and planning
//! work for all of them, and hands candle the bytes of the tensors it can compute.

use candle_core::quantized::GgmlDType;

/// Declares the enum and its table in one place, so an id, its name and its block layout can
/// never drift apart.
macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal;)*) => {
        /// A GGUF tensor type (ggml's `ggml_type`), named as ggml names it.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum GgufType {
            $(
                #[doc = concat!("`", $name, "` (id ", $id, "): ", $block, " elements in ", $bytes, " bytes.")]
                $variant,
            )*
        }

        impl GgufType {
            /// Every type, in id order.
            pub const ALL: &'static [GgufType] = &[$(GgufType::$variant),*];

            /// The type with GGUF id `id`, if ggml defines one (ids of removed types are `None`).
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgufType::$variant),)*
                    _ => None,
                }
            }

            /// The id stored in GGUF tensor infos.
            pub fn id(self) -> u32 {
                match self {
                    $(GgufType::$variant => $id,)*
                }
            }

            /// ggml's name, e.g. `Q4_K`, `IQ4_XS`.
            pub fn name(self) -> &'static str {
                match self {
                    $(GgufType::$variant => $name,)*
                }
            }

            /// Elements per block (1 for plain numeric types).
            pub fn block_size(self) -> usize {
                match self {
                    $(GgufType::$variant => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self {
                    $(GgufType::$variant => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
}

impl GgufType {
    /// Bytes a tensor of `elems` elements takes, or `None` when `elems` is not a whole number of
    /// blocks (a malformed tensor).
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        elems
            .is_multiple_of(block)
            .then(|| elems / block * self.type_size() as u64)
    }

    /// Whether this is a block format (quantized) rather than plain numbers.
    pub fn is_block(self) -> bool {
        self.block_size() > 1
    }

    /// candle's type for this one, when candle 0.11.1 has it (its kernels and dequantizers
    /// then apply).
    pub fn to_candle(self) -> Option<GgmlDType> {
        Some(match self {
            GgufType::F32 => GgmlDType::F32,
            GgufType::F16 => GgmlDType::F16,
            GgufType::BF16 => GgmlDType::BF16,
            GgufType::Q4_0 => GgmlDType::Q4_0,
            GgufType::Q4_1 => GgmlDType::Q4_1,
            GgufType::Q5_0 => GgmlDType::Q5_0,
            GgufType::Q5_1 => GgmlDType::Q5_1,
            GgufType::Q8_0 => GgmlDType::Q8_0,
            GgufType::Q8_1 => GgmlDType::Q8_1,
            GgufType::Q2_K => GgmlDType::Q2K,
            GgufType::Q3_K => GgmlDType::Q3K,
            GgufType::Q4_K => GgmlDType::Q4K,
            GgufType::Q5_K => GgmlDType::Q5K,
            GgufType::Q6_K => GgmlDType::Q6K,
            GgufType::Q8_K => GgmlDType::Q8K,
            _ => return None,
        })
    }
}

impl GgufType {
    /// ferry's name for candle's type `dtype` (every candle type is a ggml type).
    pub fn from_candle(dtype: GgmlDType) -> Self {
        match dtype {
            GgmlDType::F32 => GgufType::F32,
            GgmlDType::F16 => GgufType::F16,
            GgmlDType::BF16 => GgufType::BF16,
            GgmlDType::Q4_0 => GgufType::Q4_0,
            GgmlDType::Q4_1 => GgufType::Q4_1,
            GgmlDType::Q5_0 => GgufType::Q5_0,
            GgmlDType::Q5_1 => GgufType::Q5_1,
            GgmlDType::Q8_0 => GgufType::Q8_0,
            GgmlDType::Q8_1 => GgufType::Q8_1,
            GgmlDType::Q2K => GgufType::Q2_K,
            GgmlDType::Q3K => GgufType::Q3_K,
            GgmlDType::Q4K => GgufType::Q4_K,
            GgmlDType::Q5K => GgufType::Q5_K,
            GgmlDType::Q6K => GgufType::Q6_K,
            GgmlDType::Q8K => GgufType::Q8_K,
        }
    }
}

impl std::fmt::Display for GgufType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::GgufType;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &ty in GgufType::ALL {
            assert_eq!(GgufType::from_id(ty.id()), Some(ty), "{ty}");
        }
        // Q4_2, Q4_3 and the repacked Q4_0_4_4 / IQ4_NL_4_4 families were removed from ggml.
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 1000] {
            assert_eq!(GgufType::from_id(removed), None, "{removed}");
        }
    }

    #[test]
    fn agrees_with_candle_on_the_types_candle_knows() {
        let mut known = 0;
        for &ty in GgufType::ALL {
            let Some(candle) = ty.to_candle() else {
                continue;
            };
            known += 1;
            assert_eq!(ty.block_size(), candle.block_size(), "{ty}");
            assert_eq!(ty.type_size(), candle.type_size(), "{ty}");
            assert_eq!(GgufType::from_candle(candle), ty);
        }
        assert_eq!(known, 15);
        assert_eq!(GgufType::IQ4_NL.to_candle(), None);
    }

    #[test]
    fn sizes_whole_blocks_only() {
        assert_eq!(GgufType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgufType::Q4_K.bytes_for(300), None);
        assert_eq!(GgufType::MXFP4.bytes_for(64), Some(34));
        assert_eq!(GgufType::F16.bytes_for(3), Some(6));
        assert!(GgufType::IQ4_XS.is_block() && !GgufType::BF16.is_block());
    }
}

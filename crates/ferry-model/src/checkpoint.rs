//! [`Checkpoint`]: a model's weight files opened once per load. Each file is memory-mapped and its
//! header parsed once ([`super::header`]); from that come the [`ModelSpec`] (GGUF metadata or
//! config.json) and the [`TensorTable`] (every tensor the model uses, checked). `ferry plan`'s
//! sizing, the tokenizer (GGUF vocabularies), the loader and the host slabs all take this one
//! value, so none of them parses a header again and none can accept what another refuses.
//!
//! Tensor bytes are slices of the maps. On the CPU a GGUF matrix is used in place:
//! [`Checkpoint::view_blocks`] hands out [`Blocks`] views that share the map (it stays mapped as
//! long as any weight views it, and its pages are the model's only copy). Elsewhere
//! [`Checkpoint::read_blocks`] and [`Checkpoint::read_dense`] turn a record into a candle tensor
//! on a device (dequantizing with ferry's own decoders the types candle lacks). Drop the
//! checkpoint once the model is loaded: the safetensors maps would otherwise keep the file's
//! pages counted as resident.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use super::cpu_qmatmul::{dequant, Blocks};
use super::error::{ModelError, Result};
use super::header::{map_file, GgufHeader, GgufMetadata, Shards};
use super::source::ModelFiles;
use super::spec::ModelSpec;
use super::tensors::{Format, StoredType, TensorRecord, TensorTable};

/// The parsed headers of one model's files.
#[derive(Debug)]
enum Headers {
    /// One GGUF model: a file, or the splits of one (`-00001-of-0000N.gguf`), whose header
    /// (the first split's, with every split's tensors) indexes `maps`.
    Gguf {
        maps: Vec<Arc<Mmap>>,
        header: GgufHeader,
    },
    /// Hugging Face safetensors shards.
    Safetensors(Shards),
}

/// A model's files, their headers, spec and tensor table, read once.
#[derive(Debug)]
pub struct Checkpoint {
    files: ModelFiles,
    headers: Headers,
    spec: ModelSpec,
    tensors: TensorTable,
}

impl Checkpoint {
    /// Maps the weight files of `files`, parses their headers, the spec and the tensor table.
    pub fn open(files: &ModelFiles) -> Result<Self> {
        let (headers, spec) = match files {
            ModelFiles::Gguf { path } => {
                let (maps, header) = open_gguf(path)?;
                let spec = ModelSpec::from_gguf(&header)?;
                (Headers::Gguf { maps, header }, spec)
            }
            ModelFiles::HfDir {
                config, weights, ..
            } => {
                let json = std::fs::read_to_string(config).map_err(|source| ModelError::Io {
                    path: config.clone(),
                    source,
                })?;
                let spec = ModelSpec::from_hf_config(&json)?;
                (Headers::Safetensors(Shards::open(weights)?), spec)
            }
        };
        let tensors = match &headers {
            Headers::Gguf { header, .. } => {
                let lookup = |name: &str| {
                    let info = header.tensor(name)?;
                    Some(TensorRecord {
                        name: info.name.clone(),
                        shape: info.shape.clone(),
                        stored: StoredType::Gguf(info.ty),
                        file: header.tensor_file(info),
                        range: header.data_range(info),
                    })
                };
                let names = header.tensors.iter().map(|t| t.name.as_str());
                TensorTable::build(Format::Gguf, &spec, &lookup, names)?
            }
            Headers::Safetensors(shards) => {
                let lookup = |name: &str| {
                    let t = shards.tensor(name)?;
                    Some(TensorRecord {
                        name: name.to_string(),
                        shape: t.info.shape.clone(),
                        stored: StoredType::Safetensors(t.info.dtype),
                        file: t.shard,
                        range: shards.data_range(&t),
                    })
                };
                TensorTable::build(Format::Safetensors, &spec, &lookup, shards.names())?
            }
        };
        Ok(Self {
            files: files.clone(),
            headers,
            spec,
            tensors,
        })
    }

    /// The files this checkpoint was read from.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }

    /// Shape and hyper-parameters.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Every tensor the model uses.
    pub fn tensors(&self) -> &TensorTable {
        &self.tensors
    }

    /// The file format.
    pub fn format(&self) -> Format {
        self.tensors.format
    }

    /// The GGUF header (metadata and every tensor info), for a GGUF checkpoint.
    pub fn gguf(&self) -> Option<&GgufHeader> {
        match &self.headers {
            Headers::Gguf { header, .. } => Some(header),
            Headers::Safetensors(_) => None,
        }
    }

    /// GGUF metadata (the tokenizer's vocabulary lives there, read in place from the map), for
    /// a GGUF checkpoint.
    pub fn gguf_metadata(&self) -> Option<GgufMetadata<'_>> {
        match &self.headers {
            Headers::Gguf { maps, header } => Some(GgufMetadata::new(header, &maps[0])),
            Headers::Safetensors(_) => None,
        }
    }

    /// The GGUF files, as [`TensorRecord::file`] indexes them (the splits of a split model);
    /// `None` for safetensors.
    pub fn gguf_paths(&self) -> Option<Vec<PathBuf>> {
        let (ModelFiles::Gguf { path }, Headers::Gguf { maps, .. }) = (&self.files, &self.headers)
        else {
            return None;
        };
        match maps.len() {
            1 => Some(vec![path.clone()]),
            count => split_paths(path, count).ok(),
        }
    }

    /// The stored bytes of `record`.
    pub fn bytes(&self, record: &TensorRecord) -> Result<&[u8]> {
        let file: &[u8] = match &self.headers {
            Headers::Gguf { maps, .. } => maps.get(record.file).map_or(&[][..], |m| &m[..]),
            Headers::Safetensors(shards) => shards.bytes(record.file),
        };
        file.get(record.range.clone()).ok_or_else(|| {
            ModelError::Source(format!("`{}` lies past the end of its file", record.name))
        })
    }

    /// `record`'s GGUF blocks in place: a view of the mapped file that keeps the map alive
    /// (nothing is read or copied).
    pub fn view_blocks(&self, record: &TensorRecord) -> Result<Blocks> {
        let (Headers::Gguf { maps, .. }, StoredType::Gguf(ty)) = (&self.headers, record.stored)
        else {
            return Err(ModelError::Source(format!(
                "`{}` is not a GGUF tensor",
                record.name
            )));
        };
        let map = maps.get(record.file).ok_or_else(|| {
            ModelError::Source(format!("`{}` names a split that is not open", record.name))
        })?;
        Blocks::mapped(map.clone(), record.range.clone(), ty, &record.shape)
    }

    /// `record`'s GGUF blocks as a candle quantized tensor on `device` (the bytes are copied
    /// once, into the tensor's own storage); for the types candle 0.11.1 knows.
    pub fn read_blocks(&self, record: &TensorRecord, device: &Device) -> Result<QTensor> {
        let StoredType::Gguf(ty) = record.stored else {
            return Err(ModelError::Source(format!(
                "`{}` is not a GGUF tensor",
                record.name
            )));
        };
        let dtype = ty.to_candle().ok_or_else(|| unsupported_type(record, ty))?;
        let storage = QStorage::from_data(Cow::Borrowed(self.bytes(record)?), device, dtype)
            .map_err(|e| self.read_error(record, e))?;
        Ok(QTensor::new(storage, record.shape.as_slice())?)
    }

    /// `record` as a dense tensor of `dtype` on `device`: GGUF tensors are dequantized (on the
    /// device by candle; on the CPU by ferry for the types candle lacks, then converted and
    /// uploaded), safetensors converted from their stored dtype.
    pub fn read_dense(
        &self,
        record: &TensorRecord,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let tensor = match record.stored {
            StoredType::Gguf(ty) if ty.to_candle().is_none() && dequant::supports(ty) => {
                let mut values = vec![0f32; record.elem_count()];
                dequant::dequantize(ty, self.bytes(record)?, &mut values)?;
                let cpu = Tensor::from_vec(values, record.shape.as_slice(), &Device::Cpu)?;
                return Ok(cpu.to_dtype(dtype)?.to_device(device)?);
            }
            StoredType::Gguf(_) => self
                .read_blocks(record, device)?
                .dequantize(device)
                .map_err(|e| self.read_error(record, e))?,
            StoredType::Safetensors(st) => {
                let view = safetensors::tensor::TensorView::new(
                    st,
                    record.shape.clone(),
                    self.bytes(record)?,
                )
                .map_err(|e| ModelError::Source(format!("`{}`: {e}", record.name)))?;
                view.load(device).map_err(|e| self.read_error(record, e))?
            }
        };
        Ok(tensor.to_dtype(dtype)?)
    }

    fn read_error(&self, record: &TensorRecord, e: candle_core::Error) -> ModelError {
        let path = match &self.files {
            ModelFiles::Gguf { path } => path.as_path(),
            ModelFiles::HfDir { weights, .. } => weights
                .get(record.file)
                .map_or(std::path::Path::new("?"), |p| p.as_path()),
        };
        ModelError::Source(format!(
            "{}: reading `{}`: {e}",
            path.display(),
            record.name
        ))
    }
}

/// Maps a GGUF file and parses its header; when it is the first of a split model
/// (`split.count` > 1), maps and parses the other splits beside it too
/// ([`split_paths`]), and the header describes them all.
fn open_gguf(path: &Path) -> Result<(Vec<Arc<Mmap>>, GgufHeader)> {
    let parse = |path: &Path| -> Result<(Mmap, GgufHeader)> {
        let map = map_file(path)?;
        let header = GgufHeader::parse(&map).map_err(|e| {
            ModelError::Source(format!("{} is not a GGUF file: {e}", path.display()))
        })?;
        Ok((map, header))
    };
    let (map, mut header) = parse(path)?;
    let mut maps = vec![Arc::new(map)];
    let count = header.split_count();
    if count == 1 {
        return Ok((maps, header));
    }
    if header.split_index() != 0 {
        return Err(ModelError::Source(format!(
            "{} is split {} of {count} of a model; pass the first split (-00001-of-{count:05}.gguf)",
            path.display(),
            header.split_index() + 1
        )));
    }
    for (file, split) in split_paths(path, count)?.iter().enumerate().skip(1) {
        let (map, part) = parse(split)?;
        if part.split_index() != file || part.split_count() != count {
            return Err(ModelError::Source(format!(
                "{} says it is split {} of {}, not {} of {count}",
                split.display(),
                part.split_index() + 1,
                part.split_count(),
                file + 1
            )));
        }
        header
            .absorb_split(part, file)
            .map_err(|e| ModelError::Source(format!("{}: {e}", split.display())))?;
        maps.push(Arc::new(map));
    }
    tracing::info!(
        path = %path.display(),
        splits = count,
        tensors = header.tensors.len(),
        "a split GGUF: loading its {count} files as one model"
    );
    Ok((maps, header))
}

/// The files of a model split in `count` (llama.cpp's `PREFIX-00001-of-0000N.gguf` names),
/// given the first; each must exist.
pub fn split_paths(first: &Path, count: usize) -> Result<Vec<PathBuf>> {
    let name = first.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let suffix = format!("-00001-of-{count:05}.gguf");
    let prefix = name
        .len()
        .checked_sub(suffix.len())
        .filter(|&at| name[at..].eq_ignore_ascii_case(&suffix))
        .map(|at| &name[..at])
        .ok_or_else(|| {
            ModelError::Source(format!(
                "{} is the first of {count} splits, but its name does not end in {suffix}, so                  the others cannot be found",
                first.display()
            ))
        })?;
    let dir = first.parent().unwrap_or(Path::new(""));
    (1..=count)
        .map(|no| {
            let path = dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"));
            if path.is_file() {
                Ok(path)
            } else {
                Err(ModelError::Source(format!(
                    "split {no} of {count} of {} is missing: {} does not exist",
                    first.display(),
                    path.display()
                )))
            }
        })
        .collect()
}

/// The error for a GGUF tensor of a type ferry cannot compute (yet).
pub fn unsupported_type(record: &TensorRecord, ty: super::header::GgufType) -> ModelError {
    ModelError::Unsupported(format!(
        "tensor `{}` is stored as {ty}, a GGUF type ferry cannot compute yet \
         (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q8_K, IQ4_NL, \
         IQ4_XS, MXFP4)",
        record.name
    ))
}

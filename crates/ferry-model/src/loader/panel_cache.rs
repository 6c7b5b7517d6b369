//! The panel cache: the eight-row panel layouts ([`Panels`]) the CPU loader makes of a model's
//! k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 matrices on AVX2 machines, kept in one file per
//! model so that the next load maps them instead of making them again (making them took 3-7x a warm
//! read of the model file on the Zen 3 VM of docs/BENCHMARKS.md; mapping a cache file takes about
//! nothing, its pages come in as the kernels first read them, as the model file's do).
//!
//! The folder is the process's choice ([`set_panel_cache`], `device.panel_cache`: the user's
//! cache unless configured; no folder, so no cache, unless the binary sets one). The file of a
//! model is `<folder>/<first file's stem>-<CRC-32 of its canonical path>.panels`: a magic, the
//! header's length and CRC-32, a JSON header (the layout's version, the model's files with
//! their sizes and modification times, and per matrix its name, shape, where its GGUF rows lie
//! and a CRC-32 of their first and last 4 KiB, and where its panels lie in this file), then the
//! panels, each at a 4 KiB boundary. A matrix's cached panels are used only when all of that
//! still matches (the files unchanged, the same layout version, record and sampled bytes);
//! otherwise they are made again and the file rewritten.
//!
//! Files are written whole, after the load, on a thread of their own, to a temporary name that
//! is renamed into place after `fsync`: a reader never sees a half-written one. The panels'
//! own bytes are not hashed again when read (that would read the whole file at every load, the
//! cost the cache removes); like the model file, a cache file must not be rewritten in place
//! while a server maps it. Writing also deletes the folder's cache files whose model files are
//! gone, and temporaries over an hour old, so the folder holds at most one file per model; no
//! file is written where its disk has less than twice its size free.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::cpu_qmatmul::panel8::{self, PanelFormat, PanelShape, Panels};
use crate::cpu_qmatmul::CpuQMatMul;
use crate::tensors::TensorRecord;
pub use ferry_config::PanelCacheChoice;

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"FERRYPNL";
/// Magic, header length (u64) and header CRC-32 (u32).
const PREFIX: usize = 20;
/// Panels start at multiples of this (a page).
const ALIGN: usize = 4096;
/// Bytes at each end of a matrix's GGUF rows whose CRC-32 the header keeps.
const SAMPLE: usize = 4096;
/// The cache files' extension.
const EXTENSION: &str = "panels";
/// Temporaries older than this are a crashed writer's and are deleted.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// The folder [`set_panel_cache`] chose.
static FOLDER: RwLock<Option<PathBuf>> = RwLock::new(None);
/// Cache writes in flight ([`wait_for_panel_cache_writes`]).
static WRITERS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Sets the process-wide panel cache folder from `device.panel_cache` (the binary does, once,
/// before any model loads; until then there is no cache).
pub fn set_panel_cache(choice: &PanelCacheChoice) {
    let folder = panel_cache_folder(choice, |k| std::env::var_os(k).map(PathBuf::from));
    *FOLDER.write().unwrap_or_else(|e| e.into_inner()) = folder;
}

/// The folder `choice` names, the user's cache read through `var`: `$XDG_CACHE_HOME/ferry/panels`,
/// else `$HOME/.cache/ferry/panels`; `None` for `off` or without either variable.
pub fn panel_cache_folder(
    choice: &PanelCacheChoice,
    var: impl Fn(&str) -> Option<PathBuf>,
) -> Option<PathBuf> {
    match choice {
        PanelCacheChoice::Off => None,
        PanelCacheChoice::Dir(dir) => Some(dir.clone()),
        PanelCacheChoice::Auto => Some(ferry_config::user_cache_folder(var)?.join("panels")),
    }
}

/// The folder [`set_panel_cache`] chose, if any.
pub fn process_panel_cache() -> Option<PathBuf> {
    FOLDER.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Waits for the cache files being written in the background (tests; a process may also
/// exit without: the temporary is then left for a later write to delete).
pub fn wait_for_panel_cache_writes() {
    let writers = std::mem::take(&mut *WRITERS.lock().unwrap_or_else(|e| e.into_inner()));
    for writer in writers {
        let _ = writer.join();
    }
}

/// One of the model's files as the cache saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SourceFile {
    path: PathBuf,
    size: u64,
    modified_ns: u64,
}

impl SourceFile {
    fn of(path: &Path) -> std::io::Result<SourceFile> {
        let meta = std::fs::metadata(path)?;
        let modified_ns = meta
            .modified()?
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(SourceFile {
            path: std::fs::canonicalize(path)?,
            size: meta.len(),
            modified_ns,
        })
    }
}

/// One matrix's panels in a cache file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    name: String,
    format: String,
    rows: usize,
    kb: usize,
    /// The model file ([`TensorRecord::file`]) and offset of its GGUF rows.
    source_file: usize,
    source_offset: usize,
    /// CRC-32 of the first and last [`SAMPLE`] bytes of the GGUF rows.
    source_sample: u32,
    /// Where the panels start, from the end of the header's padding.
    offset: usize,
}

impl Entry {
    /// Whether `self` (read from a file) describes the same matrix as `current`.
    fn same_matrix(&self, current: &Entry) -> bool {
        Entry {
            offset: current.offset,
            ..self.clone()
        } == *current
    }
}

/// A cache file's header.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    layout: u32,
    sources: Vec<SourceFile>,
    matrices: Vec<Entry>,
}

/// A valid cache file, mapped.
struct Found {
    map: Arc<Mmap>,
    /// By name, offsets from the start of the file.
    matrices: HashMap<String, Entry>,
}

/// One model's panel cache during a load: the panels its file holds, and those made.
pub struct PanelCache {
    file: PathBuf,
    sources: Vec<SourceFile>,
    found: Option<Found>,
    /// Every matrix given panels so far, in order.
    used: Vec<(Entry, Arc<Panels>)>,
    made: usize,
    mapped: usize,
    made_seconds: f64,
}

impl std::fmt::Debug for PanelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PanelCache")
            .field("file", &self.file)
            .field("made", &self.made)
            .field("mapped", &self.mapped)
            .finish_non_exhaustive()
    }
}

impl PanelCache {
    /// The cache in `folder` of `checkpoint`'s model, its file read when it has a valid one;
    /// `None` for a model that is not GGUF, or whose files cannot be looked at (logged).
    pub fn open(folder: &Path, checkpoint: &Checkpoint) -> Option<PanelCache> {
        let paths = checkpoint.gguf_paths()?;
        let sources: Vec<SourceFile> = match paths.iter().map(|p| SourceFile::of(p)).collect() {
            Ok(sources) => sources,
            Err(e) => {
                tracing::warn!("panel cache: cannot look at the model's files ({e}); none used");
                return None;
            }
        };
        let file = folder.join(file_name(&paths[0], &sources));
        let found = match read(&file, &sources) {
            Ok(found) => found,
            Err(why) => {
                tracing::info!(
                    "panel cache {}: {why}; the layouts are made again",
                    file.display()
                );
                None
            }
        };
        Some(PanelCache {
            file,
            sources,
            found,
            used: Vec::new(),
            made: 0,
            mapped: 0,
            made_seconds: 0.0,
        })
    }

    /// Matrices whose panels were made so far, and those mapped from the file.
    pub fn counts(&self) -> (usize, usize) {
        (self.made, self.mapped)
    }

    /// The panels of `weight` (read from `record`, of `shape`): the file's when they match,
    /// else made now (and kept for the file).
    pub fn panels(
        &mut self,
        checkpoint: &Checkpoint,
        record: &TensorRecord,
        weight: &CpuQMatMul,
        shape: PanelShape,
    ) -> Result<Arc<Panels>, String> {
        let rows = checkpoint.bytes(record).map_err(|e| e.to_string())?;
        let entry = Entry {
            name: record.name.clone(),
            format: format_name(shape.format).to_string(),
            rows: shape.rows,
            kb: shape.kb,
            source_file: record.file,
            source_offset: record.range.start,
            source_sample: sample_crc(rows),
            offset: 0,
        };
        if let Some(found) = &self.found {
            let cached = found
                .matrices
                .get(&record.name)
                .filter(|cached| cached.same_matrix(&entry))
                .and_then(|cached| {
                    let range = cached.offset..cached.offset + shape.bytes();
                    Panels::mapped(shape, found.map.clone(), range)
                });
            if let Some(panels) = cached {
                let panels = Arc::new(panels);
                self.used.push((entry, panels.clone()));
                self.mapped += 1;
                return Ok(panels);
            }
        }
        let started = Instant::now();
        let panels = Arc::new(weight.pack_panels()?);
        self.made_seconds += started.elapsed().as_secs_f64();
        self.made += 1;
        self.used.push((entry, panels.clone()));
        Ok(panels)
    }

    /// Logs what this load took from the file and, when it made any panels, writes the file
    /// on a thread of its own ([`wait_for_panel_cache_writes`] waits for it).
    pub fn finish(self) {
        if self.mapped > 0 {
            tracing::info!(
                "panel layouts of {} matrices mapped from {}",
                self.mapped,
                self.file.display()
            );
        }
        if self.made == 0 {
            return;
        }
        tracing::info!(
            "made the panel layouts of {} matrices in {:.2} s; writing them to {} for the next load",
            self.made,
            self.made_seconds,
            self.file.display()
        );
        let spawned = std::thread::Builder::new()
            .name("ferry-panel-cache".to_string())
            .spawn(move || {
                let started = Instant::now();
                match self.write() {
                    Ok(bytes) => tracing::info!(
                        "panel cache {} written: {:.1} MiB in {:.2} s",
                        self.file.display(),
                        bytes as f64 / (1 << 20) as f64,
                        started.elapsed().as_secs_f64()
                    ),
                    Err(e) => tracing::warn!(
                        "panel cache {} not written: {e}; the next load makes the layouts again",
                        self.file.display()
                    ),
                }
            });
        match spawned {
            Ok(writer) => {
                let mut writers = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
                // Finished writers are let go, so a long-lived process keeps none of them.
                writers.retain(|w| !w.is_finished());
                writers.push(writer);
            }
            Err(e) => tracing::warn!("panel cache not written: no thread for it ({e})"),
        }
    }

    /// Writes the file (a temporary, `fsync`ed, renamed into place) with every matrix of this
    /// load; deletes the folder's files of models that are gone. Returns the bytes written.
    fn write(&self) -> std::io::Result<u64> {
        let folder = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(folder)?;
        let bytes: u64 = self.used.iter().map(|(_, p)| p.len() as u64).sum();
        room_for(bytes, free_bytes(folder)).map_err(std::io::Error::other)?;
        let mut matrices = Vec::with_capacity(self.used.len());
        let mut end = 0;
        for (entry, panels) in &self.used {
            matrices.push(Entry {
                offset: end,
                ..entry.clone()
            });
            end = (end + panels.len()).next_multiple_of(ALIGN);
        }
        let header = serde_json::to_vec(&Header {
            layout: layout_version(),
            sources: self.sources.clone(),
            matrices,
        })
        .map_err(std::io::Error::other)?;
        // Its own name per writer: two loads of one model in one process write at once too.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let temporary = folder.join(format!(
            ".{}.{}-{}.tmp",
            self.file.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        let written = write_file(&temporary, &header, &self.used)
            .and_then(|bytes| std::fs::rename(&temporary, &self.file).map(|()| bytes));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        sweep(folder, &self.file);
        written
    }
}

/// Whether a file of `bytes` may be written where `free` bytes are free (unknown: yes): a
/// cache never takes the last of a disk, so only where twice its size is free.
fn room_for(bytes: u64, free: Option<u64>) -> Result<(), String> {
    match free {
        Some(free) if free < bytes.saturating_mul(2) => Err(format!(
            "{} MiB free on its disk, the file would take {} MiB (it is written when twice \
             that is free)",
            free >> 20,
            bytes >> 20
        )),
        _ => Ok(()),
    }
}

/// Bytes free to an unprivileged writer on the file system holding `folder`; `None` where
/// that cannot be asked.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(clippy::useless_conversion)] // u64 already on 64-bit targets, not on every one
fn free_bytes(folder: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(folder.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated; `stat` is a valid out-parameter.
    let ok = unsafe { libc::statvfs(path.as_ptr(), &mut stat) } == 0;
    ok.then(|| u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn free_bytes(_folder: &Path) -> Option<u64> {
    None
}

/// Writes the prefix, `header`, and each matrix's panels at its offset; `fsync`s.
fn write_file(path: &Path, header: &[u8], used: &[(Entry, Arc<Panels>)]) -> std::io::Result<u64> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    out.write_all(MAGIC)?;
    out.write_all(&(header.len() as u64).to_le_bytes())?;
    out.write_all(&crc32fast::hash(header).to_le_bytes())?;
    out.write_all(header)?;
    let mut at = PREFIX + header.len();
    let padding = [0u8; ALIGN];
    let pad_to = |out: &mut BufWriter<File>, at: &mut usize| -> std::io::Result<()> {
        let to = at.next_multiple_of(ALIGN);
        out.write_all(&padding[..to - *at])?;
        *at = to;
        Ok(())
    };
    for (_, panels) in used {
        pad_to(&mut out, &mut at)?;
        out.write_all(panels.as_bytes())?;
        at += panels.len();
    }
    pad_to(&mut out, &mut at)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(at as u64)
}

/// Reads the cache file at `path` when it is one for `sources` with this layout version:
/// `Ok(None)` when there is none, an error saying why one is not used.
fn read(path: &Path, sources: &[SourceFile]) -> Result<Option<Found>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    // SAFETY: mapped read-only; the file is only ever replaced by a rename (the mapping keeps
    // the old one), never rewritten in place (module docs), as for the model file's mapping.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| e.to_string())?;
    let (header, data) = parse_header(&map)?;
    if header.layout != layout_version() {
        return Err("made for another version of the panel layout".to_string());
    }
    if header.sources != sources {
        return Err("the model's files changed since it was made".to_string());
    }
    let matrices = header
        .matrices
        .into_iter()
        .map(|e| {
            let entry = Entry {
                offset: e.offset + data,
                ..e
            };
            (entry.name.clone(), entry)
        })
        .collect();
    Ok(Some(Found {
        map: Arc::new(map),
        matrices,
    }))
}

/// The header of a cache file's bytes (or its first bytes), and where its panels start.
fn parse_header(bytes: &[u8]) -> Result<(Header, usize), String> {
    let not_one = || "not a panel cache file".to_string();
    if bytes.len() < PREFIX || &bytes[..8] != MAGIC {
        return Err(not_one());
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let json = PREFIX
        .checked_add(len)
        .and_then(|end| bytes.get(PREFIX..end))
        .ok_or_else(|| "cut short".to_string())?;
    if crc32fast::hash(json) != crc {
        return Err("its header fails its checksum".to_string());
    }
    let header = serde_json::from_slice(json).map_err(|e| format!("unreadable header ({e})"))?;
    Ok((header, (PREFIX + len).next_multiple_of(ALIGN)))
}

/// Deletes the cache files in `folder` (but `keep`) whose model files are gone, and stale
/// temporaries. Errors are ignored: the folder is a cache.
fn sweep(folder: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > STALE_TEMPORARY);
            if old {
                let _ = std::fs::remove_file(&path);
            }
        } else if path.extension().is_some_and(|e| e == EXTENSION) && path != keep {
            let orphan = header_of(&path)
                .is_some_and(|h| h.sources.iter().any(|source| !source.path.exists()));
            if orphan {
                tracing::info!("panel cache {}: its model is gone; deleted", path.display());
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// The header of the cache file at `path`, read without mapping the panels.
fn header_of(path: &Path) -> Option<Header> {
    let mut file = File::open(path).ok()?;
    let mut prefix = [0u8; PREFIX];
    file.read_exact(&mut prefix).ok()?;
    let len = u64::from_le_bytes(prefix[8..16].try_into().ok()?) as usize;
    let mut bytes = prefix.to_vec();
    bytes.resize(PREFIX.checked_add(len)?, 0);
    file.read_exact(&mut bytes[PREFIX..]).ok()?;
    parse_header(&bytes).ok().map(|(header, _)| header)
}

/// `<stem>-<CRC-32 of the canonical path>.panels` for the model whose first file is `path`.
fn file_name(path: &Path, sources: &[SourceFile]) -> String {
    let stem = path
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy());
    let canonical = sources[0].path.to_string_lossy();
    format!(
        "{stem}-{:08x}.{EXTENSION}",
        crc32fast::hash(canonical.as_bytes())
    )
}

/// CRC-32 of the first and last [`SAMPLE`] bytes of `rows`.
fn sample_crc(rows: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&rows[..rows.len().min(SAMPLE)]);
    crc.update(&rows[rows.len().saturating_sub(SAMPLE)..]);
    crc.finalize()
}

/// The name a cache file gives a format.
fn format_name(format: PanelFormat) -> &'static str {
    use crate::cpu_qmatmul::kquants::KFormat;
    match format {
        PanelFormat::K(KFormat::Q2K) => "q2_k",
        PanelFormat::K(KFormat::Q3K) => "q3_k",
        PanelFormat::K(KFormat::Q4K) => "q4_k",
        PanelFormat::K(KFormat::Q5K) => "q5_k",
        PanelFormat::K(KFormat::Q6K) => "q6_k",
        PanelFormat::Iq4Xs => "iq4_xs",
        PanelFormat::Iq4Nl => "iq4_nl",
        PanelFormat::Mxfp4 => "mxfp4",
        PanelFormat::Q5_0 => "q5_0",
        PanelFormat::Q5_1 => "q5_1",
    }
}

/// The panel layout's version: a CRC-32 of every format's segments and of the recodings'
/// revision, so a change in the layout makes older files unused.
fn layout_version() -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&(panel8::ROWS as u32).to_le_bytes());
    crc.update(&panel8::RECODING.to_le_bytes());
    for format in PanelFormat::ALL {
        crc.update(format_name(format).as_bytes());
        for &(offset, unit, count) in format.segments() {
            for n in [offset, unit, count] {
                crc.update(&(n as u32).to_le_bytes());
            }
        }
    }
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_cache_folder_follows_xdg_then_home() {
        let at = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| PathBuf::from(v))
            }
        };
        let auto = PanelCacheChoice::Auto;
        assert_eq!(
            panel_cache_folder(&auto, at(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/ferry/panels"))
        );
        assert_eq!(
            panel_cache_folder(&auto, at(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/ferry/panels"))
        );
        assert_eq!(panel_cache_folder(&auto, at(&[])), None);
        assert_eq!(
            panel_cache_folder(&PanelCacheChoice::Off, at(&[("HOME", "/h")])),
            None
        );
        let dir = PanelCacheChoice::Dir("/d".into());
        assert_eq!(panel_cache_folder(&dir, at(&[])), Some(PathBuf::from("/d")));
    }

    #[test]
    fn a_cache_file_is_written_only_where_twice_its_size_is_free() {
        let mib = 1 << 20;
        assert!(room_for(300 * mib, Some(599 * mib))
            .unwrap_err()
            .contains("599 MiB free"));
        assert!(room_for(300 * mib, Some(600 * mib)).is_ok());
        assert!(room_for(300 * mib, None).is_ok(), "unknown: written");
        let asked = cfg!(all(target_os = "linux", target_env = "gnu"));
        assert_eq!(free_bytes(Path::new("/")).is_some_and(|b| b > 0), asked);
    }

    #[test]
    fn a_header_with_a_changed_byte_fails_its_checksum() {
        let header = serde_json::to_vec(&Header {
            layout: layout_version(),
            sources: Vec::new(),
            matrices: Vec::new(),
        })
        .unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend((header.len() as u64).to_le_bytes());
        bytes.extend(crc32fast::hash(&header).to_le_bytes());
        bytes.extend(&header);
        let (read, data) = parse_header(&bytes).unwrap();
        assert_eq!(read.layout, layout_version());
        assert_eq!(data, ALIGN);
        let last = bytes.len() - 2;
        bytes[last] ^= 0x20;
        assert!(parse_header(&bytes).unwrap_err().contains("checksum"));
        assert!(parse_header(&bytes[..PREFIX + 3])
            .unwrap_err()
            .contains("short"));
        assert!(parse_header(b"GGUF\x03\0\0\0 and more bytes")
            .unwrap_err()
            .contains("not a panel cache"));
    }
}

//! The panel cache ([`ferry::model::loader::panel_cache`]) on a real file: a tiny Llama whose
//! matrices are Q4_K and Q6_K, written by candle's quantizer. The first load makes the panel
//! layouts and writes the cache; the second maps every one of them and gives the same logits,
//! bit for bit, as a load without a cache; a model rewritten with other weights (its size and
//! modification time put back as they were) and a cache whose header lost a bit are both
//! refused and the layouts made again; a cache file whose model is gone is deleted by the next
//! write; a folder that cannot be made costs the cache, never the load; two loads of one model
//! at once (one process: the writers' temporaries must differ) leave one whole file.
//! IQ4_XS, IQ4_NL, MXFP4 (llama.cpp's quantizer's tiny fixtures), Q5_0 and Q5_1 matrices are
//! cached and mapped the same way.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::{Model, ResidentLayers};
use ferry::model::loader::panel_cache::wait_for_panel_cache_writes;
use ferry::model::loader::{read_prefix, DtypeChoice, LoadOptions, WeightReader};
use ferry::model::source::ModelFiles;

use crate::tiny::{Tiny, PROMPT, STEPS};

/// Writes the tiny model at `path`: Q6_K down projections, Q4_K the other layer matrices,
/// every weight times `scale`.
fn write_model(path: &Path, scale: f64) {
    write_typed(path, scale, |name: &str| match name {
        n if n.ends_with("ffn_down.weight") => GgmlDType::Q6K,
        n if n.starts_with("blk.") => GgmlDType::Q4K,
        _ => GgmlDType::Q8_0,
    });
}

/// Writes the tiny model at `path` with the layer matrices' types `types` gives, every weight
/// times `scale`.
fn write_typed(path: &Path, scale: f64, types: impl Fn(&str) -> GgmlDType) {
    let tiny = Tiny::k_quant_wide();
    let weights = tiny
        .random_weights(false, false)
        .into_iter()
        .map(|(name, t)| {
            let t = if name.ends_with("norm.weight") {
                t
            } else {
                (t * scale).unwrap()
            };
            (name, t)
        })
        .collect();
    tiny.write_gguf_typed(path, "llama", &weights, &types, true);
}

/// Loads `path` with the panel cache in `folder` (or none); the logits of the prompt and each
/// step, and (matrices whose panels were made, mapped from the cache).
fn load(path: &Path, folder: Option<&Path>) -> (Vec<Vec<f32>>, (usize, usize)) {
    let files = ModelFiles::Gguf {
        path: path.to_path_buf(),
    };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let mut reader = WeightReader::new(&checkpoint, &options)
        .unwrap()
        .with_panel_cache(folder);
    let n_layers = reader.spec().n_layers;
    let (parts, layers) = read_prefix(&mut reader, n_layers).unwrap();
    let counts = reader.panel_counts();
    drop(reader);
    wait_for_panel_cache_writes();
    let model = Model::new(parts).unwrap();
    let mut layers = ResidentLayers(layers);
    let mut cache = model.new_cache();
    let mut logits = vec![model.forward(PROMPT, &mut cache, &mut layers).unwrap()];
    for &t in STEPS {
        logits.push(model.forward(&[t], &mut cache, &mut layers).unwrap());
    }
    let logits = logits
        .iter()
        .map(|l: &Tensor| l.to_vec1::<f32>().unwrap())
        .collect();
    (logits, counts)
}

/// The `.panels` files in `folder`.
fn cache_files(folder: &Path) -> Vec<PathBuf> {
    let mut files = folder_entries(folder);
    files.retain(|p| p.extension().is_some_and(|e| e == "panels"));
    files
}

/// Everything in `folder` (none when it is missing), sorted.
fn folder_entries(folder: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(folder)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
}

fn bits(logits: &[Vec<f32>]) -> Vec<Vec<u32>> {
    logits
        .iter()
        .map(|l| l.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn the_panel_cache_is_mapped_by_the_next_load_and_refused_when_stale_or_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-q4_k.gguf");
    let folder = dir.path().join("panels");
    write_model(&model, 1.0);

    let (plain, none) = load(&model, None);
    let (first, made) = load(&model, Some(&folder));
    let matrices = made.0;
    if matrices == 0 {
        // The kernels read no panel layout on this CPU (no AVX2, or the AVX-512 path).
        eprintln!("skipped: this CPU's k-quant kernels read no panel layout");
        assert!(cache_files(&folder).is_empty(), "nothing to cache");
        return;
    }
    assert_eq!(none, (0, 0), "no cache, nothing counted");
    // Seven matrices per layer; the Q8_0 head and embedding have no panel layout.
    assert_eq!(made, (14, 0));
    assert_eq!(bits(&first), bits(&plain), "panels made at load");
    let files = cache_files(&folder);
    assert_eq!(files.len(), 1, "one file per model: {files:?}");

    let (second, mapped) = load(&model, Some(&folder));
    assert_eq!(mapped, (0, matrices), "every matrix mapped from the cache");
    assert_eq!(bits(&second), bits(&plain), "panels mapped from the cache");

    // Other weights under the same name, with the file's size and time put back: only the
    // sampled bytes tell, and they must.
    let stamp = std::fs::metadata(&model).unwrap().modified().unwrap();
    let size = std::fs::metadata(&model).unwrap().len();
    write_model(&model, 1.5);
    assert_eq!(std::fs::metadata(&model).unwrap().len(), size);
    std::fs::File::options()
        .write(true)
        .open(&model)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let (changed_plain, _) = load(&model, None);
    assert_ne!(bits(&changed_plain), bits(&plain), "the weights changed");
    let (changed, counts) = load(&model, Some(&folder));
    assert_eq!(counts, (matrices, 0), "stale panels refused");
    assert_eq!(bits(&changed), bits(&changed_plain));
    let (_, counts) = load(&model, Some(&folder));
    assert_eq!(counts, (0, matrices), "the rewritten cache is used");

    // A second model's cache, then the model deleted: the next write sweeps its file away.
    let other = dir.path().join("other.gguf");
    std::fs::copy(&model, &other).unwrap();
    load(&other, Some(&folder));
    assert_eq!(cache_files(&folder).len(), 2);
    std::fs::remove_file(&other).unwrap();

    // One bit of the header's JSON flipped: the checksum refuses the file.
    let file = cache_files(&folder)
        .into_iter()
        .find(|f| f.to_string_lossy().contains("tiny-q4_k"))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let (healed, counts) = load(&model, Some(&folder));
    assert_eq!(counts, (matrices, 0), "a damaged cache refused");
    assert_eq!(bits(&healed), bits(&changed_plain));
    let left = cache_files(&folder);
    assert_eq!(left, vec![file], "the gone model's cache deleted");
    let (_, counts) = load(&model, Some(&folder));
    assert_eq!(counts, (0, matrices), "the cache written again");

    // A folder that cannot be made (a file is in the way): the load goes on without a cache.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "a file").unwrap();
    let (unblocked, counts) = load(&model, Some(&blocked.join("panels")));
    assert_eq!(counts, (matrices, 0));
    assert_eq!(bits(&unblocked), bits(&changed_plain));
}

#[test]
fn two_loads_at_once_leave_one_whole_cache_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-q4_k.gguf");
    let folder = dir.path().join("panels");
    write_model(&model, 1.0);
    let (plain, _) = load(&model, None);
    // Both miss, both make the panels and write the file (each its own temporary, renamed).
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| load(&model, Some(&folder)));
        let b = s.spawn(|| load(&model, Some(&folder)));
        (a.join().unwrap(), b.join().unwrap())
    });
    let matrices = a.1 .0;
    if matrices == 0 {
        eprintln!("skipped: this CPU's k-quant kernels read no panel layout");
        return;
    }
    assert_eq!(bits(&a.0), bits(&plain));
    assert_eq!(bits(&b.0), bits(&plain));
    let entries = folder_entries(&folder);
    assert_eq!(entries.len(), 1, "one file, no temporary left: {entries:?}");
    let (mapped, counts) = load(&model, Some(&folder));
    assert_eq!(counts, (0, matrices), "the file left is whole");
    assert_eq!(bits(&mapped), bits(&plain));
}

/// IQ4_XS, IQ4_NL and MXFP4 matrices (llama.cpp's quantizer's tiny fixtures), Q5_0 and Q5_1 ones
/// (candle's) have panel layouts too: made and cached by the first load, mapped by the second, the
/// logits bit for bit those of a load without a cache.
#[test]
fn table_coded_and_q5_panels_are_cached_too() {
    let dir = tempfile::tempdir().unwrap();
    let q5 = dir.path().join("tiny-q5.gguf");
    write_typed(&q5, 1.0, |name: &str| match name {
        n if n.contains("attn") => GgmlDType::Q5_0,
        n if n.starts_with("blk.") => GgmlDType::Q5_1,
        _ => GgmlDType::Q8_0,
    });
    let fixture = |name: &str| crate::fixtures::path("quant-llamacpp").join(name);
    for (model, formats) in [
        (fixture("tiny-iq4_xs.gguf"), &["iq4_xs"][..]),
        (fixture("tiny-iq4_nl.gguf"), &["iq4_nl"][..]),
        (fixture("tiny-mxfp4.gguf"), &["mxfp4"][..]),
        (q5, &["q5_0", "q5_1"][..]),
    ] {
        let folder = dir.path().join(format!("panels-{}", formats[0]));
        let (plain, _) = load(&model, None);
        let (first, made) = load(&model, Some(&folder));
        if made.0 == 0 {
            eprintln!("skipped: this CPU's kernels read no panel layout");
            return;
        }
        let (second, mapped) = load(&model, Some(&folder));
        assert_eq!(
            mapped,
            (0, made.0),
            "{formats:?}: every matrix mapped from the cache"
        );
        assert_eq!(bits(&first), bits(&plain), "{formats:?}");
        assert_eq!(bits(&second), bits(&plain), "{formats:?}");
        let file = std::fs::read(&cache_files(&folder)[0]).unwrap();
        let header = String::from_utf8_lossy(&file[..file.len().min(64 * 1024)]);
        for format in formats {
            let name = format!("\"{format}\"");
            assert!(header.contains(&name), "{format} matrices in the file");
        }
    }
}

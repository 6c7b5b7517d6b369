//! Tests for ferry's GGUF header reader: a file written by candle's writer reads back as candle
//! reads it; a file of every ggml type written by the `gguf` Python package (the fixture of
//! scripts/make-gguf-types-fixture.py) reads as that package's reader saw it, while candle
//! refuses it; malformed headers are errors, not panics.

use std::borrow::Cow;

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;

fn fixture(name: &str) -> std::path::PathBuf {
    ferry_testkit::repo_root()
        .join("tests/fixtures/gguf-types")
        .join(name)
}

#[test]
fn reads_back_what_candles_writer_wrote() {
    let t = |shape: &[usize], dtype| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu).expect("tensor");
        QTensor::quantize(&t, dtype).expect("quantize")
    };
    let tensors = [
        ("a.f32", t(&[3, 5], GgmlDType::F32)),
        ("b.q4k", t(&[2, 256], GgmlDType::Q4K)),
        ("c.q8_0", t(&[4, 64], GgmlDType::Q8_0)),
        ("d.f16", t(&[7], GgmlDType::F16)),
    ];
    let metadata = [
        ("k.u8", Value::U8(200)),
        ("k.i8", Value::I8(-3)),
        ("k.u16", Value::U16(60000)),
        ("k.i16", Value::I16(-30000)),
        ("k.u32", Value::U32(4_000_000_000)),
        ("k.i32", Value::I32(-2_000_000_000)),
        ("k.u64", Value::U64(1 << 50)),
        ("k.i64", Value::I64(-(1 << 50))),
        ("k.f32", Value::F32(1.5)),
        ("k.f64", Value::F64(-0.125)),
        ("k.bool", Value::Bool(true)),
        ("k.string", Value::String("naïve".into())),
        (
            "k.strings",
            Value::Array(vec![Value::String("x".into()), Value::String("".into())]),
        ),
        (
            "k.nested",
            Value::Array(vec![Value::Array(vec![Value::U32(1), Value::U32(2)])]),
        ),
    ];
    let mut bytes = std::io::Cursor::new(Vec::new());
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut bytes, &meta_refs, &tensor_refs).expect("write");
    let bytes = bytes.into_inner();

    let ours = GgufHeader::parse(&bytes).expect("ferry reads it");
    let candle = Content::read(&mut std::io::Cursor::new(&bytes)).expect("candle reads it");
    assert_eq!(ours.data_offset, candle.tensor_data_offset);
    // The array of strings stays in the file; every other key is a value.
    assert_eq!(
        ours.string_arrays.keys().collect::<Vec<_>>(),
        vec!["k.strings"]
    );
    assert_eq!(ours.metadata.len(), metadata.len() - 1);
    let all = ours
        .full_metadata(&bytes)
        .expect("the strings lie in these bytes");
    assert_eq!(all.len(), metadata.len());
    for (key, value) in &metadata {
        assert_eq!(format!("{:?}", all[*key]), format!("{value:?}"), "{key}");
        assert_eq!(
            format!("{:?}", candle.metadata[*key]),
            format!("{value:?}"),
            "{key}"
        );
    }
    assert_eq!(ours.array_len("k.strings"), Some(2));
    assert_eq!(ours.array_len("k.nested"), Some(1));
    assert_eq!(ours.array_len("k.string"), None);
    assert_eq!(ours.tensors.len(), tensors.len());
    for (name, q) in &tensors {
        let mine = ours.tensor(name).expect("tensor info");
        let theirs = &candle.tensor_infos[*name];
        assert_eq!(mine.shape, theirs.shape.dims(), "{name}");
        assert_eq!(mine.offset, theirs.offset, "{name}");
        assert_eq!(mine.ty.to_candle(), Some(theirs.ggml_dtype), "{name}");
        assert_eq!(mine.len as usize, q.storage_size_in_bytes(), "{name}");
        // The data range holds exactly the tensor's bytes.
        let range = ours.data_range(mine);
        let data = q.data().expect("bytes");
        assert_eq!(&bytes[range], &data[..], "{name}");
    }
}

#[test]
fn reads_every_ggml_type_that_candle_refuses() {
    let bytes = std::fs::read(fixture("all-types.gguf")).expect("fixture");
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("all-types.json")).expect("json"))
            .expect("oracle JSON");

    let refused = Content::read(&mut std::io::Cursor::new(&bytes))
        .expect_err("candle 0.11.1 does not know IQ4_NL and friends");
    assert!(refused.to_string().contains("unknown dtype"), "{refused}");

    let header = GgufHeader::parse(&bytes).expect("ferry reads it");
    assert_eq!(header.version, 3);
    assert_eq!(Some(header.data_offset), oracle["data_offset"].as_u64());
    assert_eq!(Some(header.alignment), oracle["alignment"].as_u64());
    let expected = oracle["tensors"].as_array().expect("tensors");
    assert_eq!(header.tensors.len(), expected.len());
    for (ours, theirs) in header.tensors.iter().zip(expected) {
        let name = theirs["name"].as_str().expect("name");
        assert_eq!(ours.name, name);
        assert_eq!(Some(ours.ty.id() as u64), theirs["type"].as_u64(), "{name}");
        let shape: Vec<usize> = theirs["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        assert_eq!(ours.shape, shape, "{name}");
        assert_eq!(Some(ours.offset), theirs["offset"].as_u64(), "{name}");
        if ours.ty == GgufType::Q8_1 {
            // See below: the package sizes Q8_1 blocks at 40 bytes, ggml (and ferry) at 36.
            assert_eq!((ours.len, theirs["bytes"].as_u64()), (72, Some(80)));
            continue;
        }
        assert_eq!(Some(ours.len), theirs["bytes"].as_u64(), "{name}");
    }
    for ty in [GgufType::IQ4_NL, GgufType::IQ4_XS, GgufType::MXFP4] {
        let info = header
            .tensor(&format!("t.{}", ty.name().to_lowercase()))
            .expect("tensor of the type");
        assert_eq!(info.ty, ty);
    }
    assert!(matches!(
        header.metadata.get("test.string"),
        Some(Value::String(s)) if s == "héllo"
    ));
    let metadata = GgufMetadata::new(&header, &bytes);
    let strings = metadata.strings("test.strings").expect("strings");
    assert_eq!(strings.map(|s| s.len()), Some(3));
    assert!(matches!(
        header.full_metadata(&bytes).expect("in place").get("test.strings"),
        Some(Value::Array(a)) if a.len() == 3
    ));
    assert!(matches!(
        header.metadata.get("test.u64"),
        Some(Value::U64(v)) if *v == 1 << 40
    ));

    // ferry's type table is the gguf package's, type for type.
    let types = oracle["types"].as_object().expect("types");
    assert_eq!(types.len(), GgufType::ALL.len());
    for (id, entry) in types {
        let ty = GgufType::from_id(id.parse().expect("id")).expect("known id");
        assert_eq!(Some(ty.name()), entry["name"].as_str(), "{id}");
        assert_eq!(
            Some(ty.block_size() as u64),
            entry["block"].as_u64(),
            "{ty}"
        );
        // gguf-py 0.19 still sizes Q8_1 as the old f32 d + f32 s + 32 int8 (40 bytes); ggml's
        // block_q8_1 is two f16 + 32 int8 = 36, as candle has it. Q8_1 is an intermediate type
        // of ggml's dot products that files do not carry.
        let bytes = if ty == GgufType::Q8_1 {
            40
        } else {
            ty.type_size()
        };
        assert_eq!(Some(bytes as u64), entry["bytes"].as_u64(), "{ty}");
    }
}

#[test]
fn malformed_headers_are_errors() {
    let good = std::fs::read(fixture("all-types.gguf")).expect("fixture");
    let expect_err = |bytes: &[u8], want: &str| {
        let err = GgufHeader::parse(bytes).expect_err(want);
        assert!(err.contains(want), "{want}: {err}");
    };
    expect_err(b"GGML\x03\0\0\0", "bad magic");
    expect_err(b"GGUF\x09\0\0\0", "unsupported GGUF version 9");
    expect_err(&good[..100], "the header ends early");
    // Everything but the tensor data: the last tensor lies past the end.
    expect_err(&good[..good.len() - 40], "lies past the end of the file");

    let mut huge = b"GGUF\x03\0\0\0".to_vec();
    huge.extend_from_slice(&0u64.to_le_bytes());
    huge.extend_from_slice(&1u64.to_le_bytes());
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    expect_err(&huge, "implausibly large");

    // One tensor whose type id ggml does not define.
    let mut unknown = b"GGUF\x03\0\0\0".to_vec();
    unknown.extend_from_slice(&1u64.to_le_bytes());
    unknown.extend_from_slice(&0u64.to_le_bytes());
    unknown.extend_from_slice(&1u64.to_le_bytes());
    unknown.push(b'w');
    unknown.extend_from_slice(&1u32.to_le_bytes());
    unknown.extend_from_slice(&32u64.to_le_bytes());
    unknown.extend_from_slice(&99u32.to_le_bytes());
    unknown.extend_from_slice(&0u64.to_le_bytes());
    expect_err(&unknown, "unknown ggml type id 99");

    // A block type whose row is not a whole number of blocks: type Q4_0 (id 2), 33 elements.
    // The tensor info ends with dim (8 bytes), type (4) and offset (8).
    let mut ragged = unknown.clone();
    let end = ragged.len();
    ragged[end - 12..end - 8].copy_from_slice(&2u32.to_le_bytes());
    ragged[end - 20..end - 12].copy_from_slice(&33u64.to_le_bytes());
    expect_err(&ragged, "not a whole number of Q4_0 blocks");
}

/// A GGUF v3 header with no tensors and the given metadata entries (key, type id, value bytes).
fn header_bytes(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, ty, value) in entries {
        bytes.extend_from_slice(&(key.len() as u64).to_le_bytes());
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(&ty.to_le_bytes());
        bytes.extend_from_slice(value);
    }
    bytes
}

/// An array-of-strings value (type 9, items of type 8).
fn strings_value(items: &[&[u8]]) -> Vec<u8> {
    let mut value = 8u32.to_le_bytes().to_vec();
    value.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for item in items {
        value.extend_from_slice(&(item.len() as u64).to_le_bytes());
        value.extend_from_slice(item);
    }
    value
}

#[test]
fn arrays_of_strings_read_in_place_as_candle_reads_them() {
    let items: &[&[u8]] = &[b"x", b"y\0\0", b"\xffa", b"", "na\u{ef}ve".as_bytes()];
    let bytes = header_bytes(&[
        ("a", 9, strings_value(items)),
        ("dup", 9, strings_value(&[b"gone"])),
        ("dup", 4, 7u32.to_le_bytes().to_vec()),
        ("empty", 9, strings_value(&[])),
    ]);
    let header = GgufHeader::parse(&bytes).expect("ferry reads it");
    let candle = Content::read(&mut std::io::Cursor::new(&bytes)).expect("candle reads it");
    let all = header.full_metadata(&bytes).expect("in place");
    assert_eq!(all.len(), candle.metadata.len());
    for (key, value) in &candle.metadata {
        assert_eq!(format!("{:?}", all[key]), format!("{value:?}"), "{key}");
    }
    // The later `dup` (a u32) wins, as in candle's map.
    assert!(matches!(header.metadata.get("dup"), Some(Value::U32(7))));
    assert!(!header.string_arrays.contains_key("dup"));

    let metadata = GgufMetadata::new(&header, &bytes);
    let read = metadata.strings("a").expect("strings").expect("present");
    let texts: Vec<&str> = read.iter().map(|s| s.as_ref()).collect();
    assert_eq!(texts, ["x", "y", "\u{fffd}a", "", "na\u{ef}ve"]);
    // Valid UTF-8 is borrowed from the file, not copied.
    let borrowed: Vec<bool> = read.iter().map(|s| matches!(s, Cow::Borrowed(_))).collect();
    assert_eq!(borrowed, [true, true, false, true, true]);
    assert_eq!(
        metadata.strings("empty").expect("strings").map(|s| s.len()),
        Some(0)
    );
    assert_eq!(metadata.strings("missing").expect("no error"), None);
    assert!(metadata.strings("dup").is_err(), "a u32 is not strings");
    // The same header over other bytes is an error, not a panic.
    let other = GgufMetadata::new(&header, &bytes[..bytes.len() / 2]);
    assert!(other.strings("a").is_err());
    // A map of values (candle's) reads the same strings.
    let from_map = GgufMetadata::from(&candle.metadata);
    let again: Vec<String> = from_map
        .strings("a")
        .expect("strings")
        .expect("present")
        .into_iter()
        .map(Cow::into_owned)
        .collect();
    assert_eq!(again, texts);
}

#[test]
fn an_array_of_strings_past_the_end_is_an_error() {
    let mut bytes = header_bytes(&[("a", 9, strings_value(&[b"one", b"two"]))]);
    // The last string claims more bytes than the file has.
    let end = bytes.len();
    bytes[end - 11..end - 3].copy_from_slice(&100u64.to_le_bytes());
    let err = GgufHeader::parse(&bytes).expect_err("past the end");
    assert!(
        err.contains("metadata `a`") && err.contains("ends early"),
        "{err}"
    );
}

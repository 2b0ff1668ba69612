//! Bad and re-encoded checkpoints, built in a temporary directory from the checked-in fixture:
//! every defect must come back as its specific `ModelError` variant naming the file, never a
//! panic; lossless re-encodings (gzip, f16/bf16 storages) must load to the same model.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use models::checkpoint::Checkpoint;
use models::ModelError;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tdt-real-options/model.nemo")
}

/// `model.<key>` from the generator's `expected.json`, so edits follow the fixture.
fn expected_model(key: &str) -> Result<usize> {
    let path = fixture().with_file_name("expected.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    json["model"][key]
        .as_u64()
        .map(|n| n as usize)
        .with_context(|| format!("expected.json has no integer model.{key}"))
}

/// The fixture's members as `(name, bytes)`, in archive order, names as stored (`./x`).
fn members() -> Result<Vec<(String, Vec<u8>)>> {
    let mut archive = tar::Archive::new(std::fs::File::open(fixture())?);
    let mut out = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        out.push((name, bytes));
    }
    Ok(out)
}

fn tar_bytes(members: &[(String, Vec<u8>)]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, bytes.as_slice())?;
    }
    Ok(builder.into_inner()?)
}

/// Writes `bytes` as `<tempdir>/model.nemo`; the directory lives as long as the guard.
fn write_nemo(bytes: &[u8]) -> Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.nemo");
    std::fs::write(&path, bytes)?;
    Ok((dir, path))
}

/// The fixture with member `suffix` transformed by `edit` (`None` drops it).
fn edited(suffix: &str, edit: impl Fn(Vec<u8>) -> Result<Option<Vec<u8>>>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut found = false;
    for (name, bytes) in members()? {
        if name.ends_with(suffix) {
            found = true;
            if let Some(bytes) = edit(bytes)? {
                out.push((name, bytes));
            }
        } else {
            out.push((name, bytes));
        }
    }
    if !found {
        bail!("fixture has no member ending in {suffix}");
    }
    tar_bytes(&out)
}

/// The fixture with each `(from, to)` line replacement applied to its YAML.
fn edit_yaml_lines(edits: &[(String, String)]) -> Result<Vec<u8>> {
    edited("model_config.yaml", |bytes| {
        let mut text = String::from_utf8(bytes)?;
        for (from, to) in edits {
            if text.matches(from.as_str()).count() != 1 {
                bail!("`{from}` is not in the fixture's YAML exactly once");
            }
            text = text.replace(from.as_str(), to);
        }
        Ok(Some(text.into_bytes()))
    })
}

fn edit_yaml(from: &str, to: &str) -> Result<Vec<u8>> {
    edit_yaml_lines(&[(from.to_string(), to.to_string())])
}

/// Rewrites `model_weights.ckpt`'s zip entries through `edit(name, bytes)` (`None` drops the
/// entry), storing them uncompressed with fresh CRCs, as torch does.
fn edit_ckpt(edit: impl Fn(&str, Vec<u8>) -> Result<Option<Vec<u8>>>) -> Result<Vec<u8>> {
    edited("model_weights.ckpt", |ckpt| {
        let mut zip = zip::ZipArchive::new(Cursor::new(ckpt))?;
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i)?;
            let name = entry.name()?.into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            if let Some(bytes) = edit(&name, bytes)? {
                writer.start_file(name, options)?;
                writer.write_all(&bytes)?;
            }
        }
        Ok(Some(writer.finish()?.into_inner()))
    })
}

fn load_bytes(
    bytes: &[u8],
) -> Result<(tempfile::TempDir, PathBuf, Result<Checkpoint, ModelError>)> {
    let (dir, path) = write_nemo(bytes)?;
    let result = Checkpoint::load(&path);
    Ok((dir, path, result))
}

/// The error, checked to mention `path` in its message.
fn expect_err(path: &Path, result: Result<Checkpoint, ModelError>) -> Result<ModelError> {
    match result {
        Ok(_) => bail!("{} loaded but should not have", path.display()),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&path.display().to_string()),
                "message does not name the file: {msg}"
            );
            Ok(e)
        }
    }
}

#[test]
fn truncated_tar_is_an_archive_error() -> Result<()> {
    let full = std::fs::read(fixture())?;
    let len = full.len();
    // Inside the first header, inside small members, inside the weights.
    // (Cutting only the zero padding after the end-of-archive blocks leaves a complete tar.)
    for cut in [100, 700, 5_000, len / 2, len * 9 / 10] {
        let (_dir, path, result) = load_bytes(&full[..cut])?;
        match expect_err(&path, result)? {
            ModelError::Archive { file, problem } => {
                assert_eq!(file, path);
                assert!(!problem.is_empty());
            }
            // A cut exactly between members looks like a complete, shorter archive.
            ModelError::MissingMember { file, .. } => assert_eq!(file, path),
            other => bail!("cut at {cut}: expected Archive, got {other:?}"),
        }
    }
    let (_dir, path, result) = load_bytes(&full[..len / 2])?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::Archive { problem, .. } if problem.contains("truncated")),
        "{err}"
    );
    Ok(())
}

#[test]
fn not_a_tar_is_an_archive_error() -> Result<()> {
    for bytes in [&b""[..], b"hello, this is not a tar archive", &[0u8; 4096]] {
        let (_dir, path, result) = load_bytes(bytes)?;
        let err = expect_err(&path, result)?;
        assert!(matches!(err, ModelError::Archive { .. }), "{err:?}");
    }
    Ok(())
}

#[test]
fn missing_file_is_an_io_error() {
    let path = Path::new("/nonexistent/model.nemo");
    let err = Checkpoint::load(path).err();
    assert!(
        matches!(err, Some(ModelError::Io { ref file, .. }) if file == path),
        "{err:?}"
    );
}

#[test]
fn missing_members_are_named() -> Result<()> {
    for member in ["model_weights.ckpt", "model_config.yaml"] {
        let (_dir, path, result) = load_bytes(&edited(member, |_| Ok(None))?)?;
        match expect_err(&path, result)? {
            ModelError::MissingMember { file, member: m } => {
                assert_eq!(file, path);
                assert_eq!(m, member);
            }
            other => bail!("dropping {member}: expected MissingMember, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn unknown_attention_model_is_unsupported() -> Result<()> {
    let bytes = edit_yaml(
        "self_attention_model: rel_pos\n",
        "self_attention_model: rel_pos_fancy\n",
    )?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    match expect_err(&path, result)? {
        ModelError::UnsupportedConfig { file, key, value } => {
            assert!(
                file.to_string_lossy().ends_with(":model_config.yaml"),
                "{}",
                file.display()
            );
            assert_eq!(key, "encoder.self_attention_model");
            assert_eq!(value, "rel_pos_fancy");
        }
        other => bail!("expected UnsupportedConfig, got {other:?}"),
    }
    Ok(())
}

#[test]
fn unsupported_subsampling_is_unsupported() -> Result<()> {
    let bytes = edit_yaml("subsampling: dw_striding\n", "subsampling: striding\n")?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::UnsupportedConfig { key, value, .. }
            if key == "encoder.subsampling" && value == "striding"),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn more_layers_than_weights_is_a_missing_tensor() -> Result<()> {
    let n = expected_model("n_layers")?;
    let bytes = edit_yaml(
        &format!("  n_layers: {n}\n"),
        &format!("  n_layers: {}\n", n + 1),
    )?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    match expect_err(&path, result)? {
        ModelError::MissingTensor { file, name } => {
            assert!(
                file.to_string_lossy().ends_with(":model_weights.ckpt"),
                "{}",
                file.display()
            );
            assert!(name.starts_with(&format!("encoder.layers.{n}.")), "{name}");
        }
        other => bail!("expected MissingTensor, got {other:?}"),
    }
    Ok(())
}

#[test]
fn fewer_layers_than_weights_is_invalid() -> Result<()> {
    let n = expected_model("n_layers")?;
    let bytes = edit_yaml(
        &format!("  n_layers: {n}\n"),
        &format!("  n_layers: {}\n", n - 1),
    )?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::InvalidConfig { key, .. } if key == "encoder.n_layers"),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn wrong_d_model_is_a_shape_error() -> Result<()> {
    let d = expected_model("d_model")?;
    let bytes = edit_yaml(
        &format!("  d_model: {d}\n"),
        &format!("  d_model: {}\n", 2 * d),
    )?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    match expect_err(&path, result)? {
        ModelError::TensorShape {
            file,
            name,
            expected,
            found,
        } => {
            assert!(file.to_string_lossy().ends_with(":model_weights.ckpt"));
            assert!(name.starts_with("encoder."), "{name}");
            assert_eq!(expected[0], 2 * d);
            assert_eq!(found[0], d);
        }
        other => bail!("expected TensorShape, got {other:?}"),
    }
    Ok(())
}

#[test]
fn vocab_size_disagreeing_with_tokenizer_is_a_vocabulary_error() -> Result<()> {
    let v = expected_model("vocab_size")?;
    let bytes = edit_yaml_lines(&[
        (
            format!("  vocab_size: {v}\n"),
            format!("  vocab_size: {}\n", v + 1),
        ),
        (
            format!("  num_classes: {v}\n"),
            format!("  num_classes: {}\n", v + 1),
        ),
    ])?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    match expect_err(&path, result)? {
        ModelError::Vocabulary { file, problem } => {
            assert!(
                file.to_string_lossy().ends_with("_tokenizer.model"),
                "{}",
                file.display()
            );
            assert!(problem.contains(&(v + 1).to_string()), "{problem}");
        }
        other => bail!("expected Vocabulary, got {other:?}"),
    }
    Ok(())
}

#[test]
fn corrupt_pickle_is_a_pickle_error() -> Result<()> {
    // Bytes overwritten mid-stream, and a stream cut short; the zip CRCs are recomputed so the
    // pickle reader is what must notice.
    let overwrite = |mut pkl: Vec<u8>| {
        let mid = pkl.len() / 2;
        pkl[mid..mid + 16].fill(0xff);
        pkl
    };
    let truncate = |mut pkl: Vec<u8>| {
        pkl.truncate(pkl.len() / 2);
        pkl
    };
    for corrupt in [&overwrite as &dyn Fn(Vec<u8>) -> Vec<u8>, &truncate] {
        let bytes = edit_ckpt(|name, data| {
            Ok(Some(if name.ends_with("/data.pkl") {
                corrupt(data)
            } else {
                data
            }))
        })?;
        let (_dir, path, result) = load_bytes(&bytes)?;
        match expect_err(&path, result)? {
            ModelError::Pickle { file, problem, .. } => {
                assert!(
                    file.to_string_lossy().ends_with("/data.pkl"),
                    "{}",
                    file.display()
                );
                assert!(!problem.is_empty());
            }
            other => bail!("expected Pickle, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn forbidden_global_in_pickle_is_named() -> Result<()> {
    let bytes = edit_ckpt(|name, data| {
        if !name.ends_with("/data.pkl") {
            return Ok(Some(data));
        }
        let from = b"collections\nOrderedDict\n";
        let at = data
            .windows(from.len())
            .position(|w| w == from)
            .context("no OrderedDict global in data.pkl")?;
        let mut out = data[..at].to_vec();
        out.extend_from_slice(b"os\nsystem\n");
        out.extend_from_slice(&data[at + from.len()..]);
        Ok(Some(out))
    })?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::Pickle { problem, .. } if problem.contains("os.system")),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn bytes_overwritten_in_place_fail_the_zip_checksum() -> Result<()> {
    // No re-zipping: the stored CRC no longer matches data.pkl.
    let bytes = edited("model_weights.ckpt", |mut ckpt| {
        let at = ckpt
            .windows(b"OrderedDict".len())
            .position(|w| w == b"OrderedDict")
            .context("no OrderedDict in the checkpoint")?;
        ckpt[at..at + 4].copy_from_slice(b"XXXX");
        Ok(Some(ckpt))
    })?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    let err = expect_err(&path, result)?;
    assert!(matches!(err, ModelError::Zip { .. }), "{err:?}");
    Ok(())
}

#[test]
fn corrupt_zip_is_a_zip_error() -> Result<()> {
    let bytes = edited("model_weights.ckpt", |ckpt| {
        Ok(Some(ckpt[..ckpt.len() - 200].to_vec()))
    })?;
    let (_dir, path, result) = load_bytes(&bytes)?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::Zip { file, .. } if file.to_string_lossy().ends_with(":model_weights.ckpt")),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn missing_or_short_storage_is_reported() -> Result<()> {
    let dropped = edit_ckpt(|name, data| Ok((!name.ends_with("/data/0")).then_some(data)))?;
    let (_dir, path, result) = load_bytes(&dropped)?;
    let err = expect_err(&path, result)?;
    assert!(
        matches!(&err, ModelError::MissingMember { member, .. } if member.ends_with("/data/0")),
        "{err:?}"
    );

    let short = edit_ckpt(|name, mut data| {
        if name.ends_with("/data/0") {
            data.truncate(data.len() - 4);
        }
        Ok(Some(data))
    })?;
    let (_dir, path, result) = load_bytes(&short)?;
    let err = expect_err(&path, result)?;
    assert!(matches!(err, ModelError::TensorData { .. }), "{err:?}");
    Ok(())
}

fn assert_same_model(a: &Checkpoint, b: &Checkpoint, tolerance: impl Fn(f32) -> f32) -> Result<()> {
    assert_eq!(a.config, b.config);
    assert_eq!(a.vocabulary, b.vocabulary);
    let names: Vec<&str> = a.tensors.names().collect();
    assert_eq!(names, b.tensors.names().collect::<Vec<_>>());
    for name in names {
        let ta = a.tensors.get_any_shape(name).context("listed tensor")?;
        let tb = b.tensors.get(name, &ta.shape)?;
        for (x, y) in ta.data.iter().zip(&tb.data) {
            assert!((x - y).abs() <= tolerance(*x), "{name}: {x} vs {y}");
        }
    }
    Ok(())
}

#[test]
fn gzip_wrapped_archive_loads_identically() -> Result<()> {
    let plain = Checkpoint::load(&fixture())?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&std::fs::read(fixture())?)?;
    let (_dir, _path, result) = load_bytes(&gz.finish()?)?;
    assert_same_model(&plain, &result?, |_| 0.0)
}

/// Storage key -> storage class (`FloatStorage`, `LongStorage`, ...), from a walk over the
/// opcodes torch's protocol-2 pickler emits. Independent of the crate's own reader.
fn storage_classes(pkl: &[u8]) -> Result<std::collections::HashMap<String, String>> {
    #[derive(Clone)]
    enum V {
        Str(String),
        Class(String),
        Tuple(Vec<V>),
        Other,
    }
    let byte = |p: usize| pkl.get(p).copied().context("pickle ends early");
    let u32_at = |p: usize| -> Result<u32> {
        Ok(u32::from_le_bytes(
            pkl.get(p..p + 4).context("pickle ends early")?.try_into()?,
        ))
    };
    let line_end = |p: usize| -> Result<usize> {
        Ok(p + pkl[p..]
            .iter()
            .position(|&b| b == b'\n')
            .context("unterminated line")?)
    };
    let mut stack: Vec<V> = Vec::new();
    let mut marks = Vec::new();
    let mut memo = std::collections::HashMap::new();
    let mut classes = std::collections::HashMap::new();
    let mut p = 0;
    loop {
        let op = byte(p)?;
        p += 1;
        match op {
            0x80 => p += 1,
            b'c' => {
                let end1 = line_end(p)?;
                let end2 = line_end(end1 + 1)?;
                stack.push(V::Class(String::from_utf8(pkl[end1 + 1..end2].to_vec())?));
                p = end2 + 1;
            }
            b'q' | b'r' => {
                let (id, len) = if op == b'q' {
                    (u32::from(byte(p)?), 1)
                } else {
                    (u32_at(p)?, 4)
                };
                memo.insert(
                    id,
                    stack.last().cloned().context("memo put on empty stack")?,
                );
                p += len;
            }
            b'h' | b'j' => {
                let (id, len) = if op == b'h' {
                    (u32::from(byte(p)?), 1)
                } else {
                    (u32_at(p)?, 4)
                };
                stack.push(memo.get(&id).cloned().context("unknown memo id")?);
                p += len;
            }
            b'(' => marks.push(stack.len()),
            b't' => {
                let items = stack.split_off(marks.pop().context("no mark")?);
                stack.push(V::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let items = stack.split_off(stack.len().checked_sub(n).context("short stack")?);
                stack.push(V::Tuple(items));
            }
            b')' | b'}' | b']' | b'N' | 0x88 | 0x89 => stack.push(V::Other),
            b'X' => {
                let len = u32_at(p)? as usize;
                stack.push(V::Str(String::from_utf8(pkl[p + 4..p + 4 + len].to_vec())?));
                p += 4 + len;
            }
            b'K' | b'M' | b'J' | b'G' => {
                p += match op {
                    b'K' => 1,
                    b'M' => 2,
                    b'J' => 4,
                    _ => 8,
                };
                stack.push(V::Other);
            }
            0x8a => {
                p += 1 + usize::from(byte(p)?);
                stack.push(V::Other);
            }
            b'Q' => {
                if let Some(V::Tuple(items)) = stack.pop() {
                    if let [V::Str(kind), V::Class(class), V::Str(key), ..] = items.as_slice() {
                        if kind == "storage" {
                            classes.insert(key.clone(), class.clone());
                        }
                    }
                }
                stack.push(V::Other);
            }
            b'R' => {
                stack.truncate(stack.len().saturating_sub(2));
                stack.push(V::Other);
            }
            b'b' => {
                stack.pop();
            }
            b's' => stack.truncate(stack.len().saturating_sub(2)),
            b'u' => stack.truncate(marks.pop().context("no mark")?),
            b'.' => return Ok(classes),
            other => bail!("opcode {other:#x} not expected from torch.save"),
        }
    }
}

/// The fixture with every f32 storage re-encoded as `class` (`HalfStorage`/`BFloat16Storage`).
fn reencoded(class: &str, encode: fn(f32) -> [u8; 2]) -> Result<Vec<u8>> {
    let pkl = members()?
        .into_iter()
        .find(|(n, _)| n.ends_with("model_weights.ckpt"))
        .map(|(_, ckpt)| -> Result<Vec<u8>> {
            let mut zip = zip::ZipArchive::new(Cursor::new(ckpt))?;
            let name = zip
                .file_names()
                .filter_map(|n| n.ok())
                .find(|n| n.ends_with("/data.pkl"))
                .context("pkl")?
                .to_string();
            let mut bytes = Vec::new();
            zip.by_name(&name)?.read_to_end(&mut bytes)?;
            Ok(bytes)
        })
        .context("no model_weights.ckpt")??;
    let classes = storage_classes(&pkl)?;
    let float_keys: Vec<String> = classes
        .iter()
        .filter(|(_, class)| *class == "FloatStorage")
        .map(|(key, _)| key.clone())
        .collect();
    // Every layer's num_batches_tracked stays a LongStorage.
    assert!(
        float_keys.len() > 10 && float_keys.len() < classes.len(),
        "{classes:?}"
    );
    edit_ckpt(|name, data| {
        if name.ends_with("/data.pkl") {
            let text = String::from_utf8_lossy(&data).into_owned();
            assert!(text.contains("torch\nFloatStorage\n"));
            let from = b"torch\nFloatStorage\n";
            let mut out = Vec::new();
            let mut rest = data.as_slice();
            while let Some(i) = rest.windows(from.len()).position(|w| w == from) {
                out.extend_from_slice(&rest[..i]);
                out.extend_from_slice(format!("torch\n{class}\n").as_bytes());
                rest = &rest[i + from.len()..];
            }
            out.extend_from_slice(rest);
            return Ok(Some(out));
        }
        let key = name.rsplit('/').next().unwrap_or_default();
        if name.contains("/data/") && float_keys.iter().any(|k| k == key) {
            let halves = data
                .chunks_exact(4)
                .flat_map(|b| encode(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect();
            return Ok(Some(halves));
        }
        Ok(Some(data))
    })
}

#[test]
fn half_precision_storages_widen_to_f32() -> Result<()> {
    let plain = Checkpoint::load(&fixture())?;
    let f16 = reencoded("HalfStorage", |x| half::f16::from_f32(x).to_le_bytes())?;
    let (_dir, _path, result) = load_bytes(&f16)?;
    // f16 keeps 11 significant bits; tiny values go subnormal (absolute error <= 2^-24).
    assert_same_model(&plain, &result?, |x| {
        x.abs() * 2f32.powi(-11) + 2f32.powi(-24)
    })?;

    let bf16 = reencoded("BFloat16Storage", |x| half::bf16::from_f32(x).to_le_bytes())?;
    let (_dir, _path, result) = load_bytes(&bf16)?;
    assert_same_model(&plain, &result?, |x| x.abs() * 2f32.powi(-8))
}

#[test]
fn random_corruption_never_panics() -> Result<()> {
    let original = std::fs::read(fixture())?;
    let len = original.len();
    anyhow::ensure!(len > 300_000, "fixture is only {len} bytes");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.nemo");
    // Deterministic LCG; offsets biased towards the structure (tar headers, YAML, tokenizer,
    // the zip's local headers and data.pkl near the start, its central directory at the end).
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let (mut ok, mut failed) = (0, 0);
    for round in 0..300 {
        let mut bytes = original.clone();
        let region = match round % 3 {
            0 => 0..len,
            1 => 0..len.min(300_000),
            _ => len.saturating_sub(30_000)..len,
        };
        let at = region.start + next() as usize % region.len();
        let n = 1 + next() as usize % 8;
        for byte in bytes.iter_mut().skip(at).take(n) {
            *byte = next() as u8;
        }
        std::fs::write(&path, &bytes)?;
        let outcome = std::panic::catch_unwind(|| Checkpoint::load(&path).map(|_| ()));
        match outcome {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                failed += 1;
                assert!(
                    e.to_string().contains(&path.display().to_string())
                        || matches!(e, ModelError::Io { .. }),
                    "{e}"
                );
            }
            Err(_) => bail!("panicked with {n} bytes overwritten at {at}"),
        }
    }
    // Both outcomes must actually occur, or the corruption is not reaching anything.
    assert!(ok > 0 && failed >= 10, "{ok} loaded, {failed} failed");
    Ok(())
}

#[test]
fn stft_padding_follows_the_recorded_nemo_version() -> Result<()> {
    use model_core::config::StftPadding;
    let cases = [
        ("nemo_version: 2.4.1\n", StftPadding::Reflect),
        ("nemo_version: 1.23.0\n", StftPadding::Reflect),
        ("", StftPadding::Reflect),
        ("nemo_version: 2.5.0\n", StftPadding::Zeros),
    ];
    for (line, padding) in cases {
        let bytes = edit_yaml("nemo_version: 3.0.0\n", line)?;
        let (_dir, _path, result) = load_bytes(&bytes)?;
        assert_eq!(result?.config.features.stft_padding, padding, "{line:?}");
    }
    Ok(())
}

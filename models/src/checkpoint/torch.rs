//! `torch.save` zip archives: `<stem>/data.pkl` describes the tensors, `<stem>/data/<key>` holds
//! each storage as raw little-endian bytes. Each floating tensor is decoded straight from the
//! zip entry into its own f32 buffer (f16/bf16/f64 widened or narrowed on the way), so peak
//! memory is the f32 weights plus one read buffer.

use std::collections::BTreeMap;
use std::io::{self, Read, Seek};
use std::path::Path;

use super::nemo::member_path;
use super::pickle::{self, StorageDtype, TensorRef};
use crate::error::ModelError;
use crate::tensor::Tensor;

/// Largest `data.pkl` accepted (a 0.6B model's is a few hundred kB).
const PICKLE_LIMIT_BYTES: u64 = 64 << 20;

/// Bytes decoded per read from a storage.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// Floating tensors by name; integer tensors (`num_batches_tracked`) are skipped since the
/// forward pass never reads them.
pub(crate) fn read_state_dict<R: Read + Seek>(
    reader: R,
    total_len: u64,
    file: &Path,
) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let mut zip = zip::ZipArchive::new(reader).map_err(|e| ModelError::Zip {
        file: file.to_path_buf(),
        problem: format!(
            "not a torch.save zip archive ({e}); torch < 1.6 legacy checkpoints are not supported"
        ),
    })?;
    let stem = find_stem(&zip, file)?;
    check_byteorder(&mut zip, &stem, file)?;

    let pkl_name = format!("{stem}/data.pkl");
    let pkl_path = member_path(file, &pkl_name);
    let pkl = read_entry_small(&mut zip, &pkl_name, file, PICKLE_LIMIT_BYTES)?;
    let entries = pickle::parse_state_dict(&pkl).map_err(|e| ModelError::Pickle {
        file: pkl_path,
        offset: e.offset,
        problem: e.problem,
    })?;
    drop(pkl);

    let mut tensors = BTreeMap::new();
    for (name, tref) in entries {
        if !tref.storage.dtype.is_float() {
            tracing::debug!(tensor = %name, dtype = ?tref.storage.dtype, "skipping integer tensor");
            continue;
        }
        let tensor = read_tensor(&mut zip, &stem, &name, &tref, total_len, file)?;
        tensors.insert(name, tensor);
    }
    Ok(tensors)
}

/// The single top-level directory holding `data.pkl` (torch names it after the file stem).
fn find_stem<R: Read + Seek>(zip: &zip::ZipArchive<R>, file: &Path) -> Result<String, ModelError> {
    let names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .collect();
    let mut stems = names
        .iter()
        .filter_map(|n| n.strip_suffix("/data.pkl"))
        .filter(|s| !s.is_empty() && !s.contains('/'));
    match (stems.next(), stems.next()) {
        (Some(stem), None) => Ok(stem.to_string()),
        (None, _) => Err(ModelError::MissingMember {
            file: file.to_path_buf(),
            member: "<stem>/data.pkl".to_string(),
        }),
        (Some(_), Some(_)) => Err(ModelError::Zip {
            file: file.to_path_buf(),
            problem: "more than one `<stem>/data.pkl`".to_string(),
        }),
    }
}

/// Storages are read as little-endian; `byteorder` is absent in old files (always little).
fn check_byteorder<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    stem: &str,
    file: &Path,
) -> Result<(), ModelError> {
    let name = format!("{stem}/byteorder");
    if zip.index_for_name(&name).is_none() {
        return Ok(());
    }
    let order = read_entry_small(zip, &name, file, 64)?;
    if order.trim_ascii() != b"little" {
        return Err(ModelError::Zip {
            file: file.to_path_buf(),
            problem: format!(
                "byteorder is `{}`, only little-endian storages are supported",
                String::from_utf8_lossy(&order)
            ),
        });
    }
    Ok(())
}

fn read_entry_small<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    name: &str,
    file: &Path,
    limit: u64,
) -> Result<Vec<u8>, ModelError> {
    let mut entry = open_entry(zip, name, file)?;
    if entry.size() > limit {
        return Err(ModelError::Zip {
            file: file.to_path_buf(),
            problem: format!("`{name}` is {} bytes, over the {limit} limit", entry.size()),
        });
    }
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry
        .read_to_end(&mut bytes)
        .map_err(|e| read_error(file, name, e))?;
    Ok(bytes)
}

fn open_entry<'a, R: Read + Seek>(
    zip: &'a mut zip::ZipArchive<R>,
    name: &str,
    file: &Path,
) -> Result<zip::read::ZipFile<'a, R>, ModelError> {
    zip.by_name(name).map_err(|e| match e {
        zip::result::ZipError::FileNotFound => ModelError::MissingMember {
            file: file.to_path_buf(),
            member: name.to_string(),
        },
        other => ModelError::Zip {
            file: file.to_path_buf(),
            problem: format!("`{name}`: {other}"),
        },
    })
}

fn read_error(file: &Path, name: &str, e: io::Error) -> ModelError {
    ModelError::Zip {
        file: file.to_path_buf(),
        problem: format!("reading `{name}`: {e}"),
    }
}

fn read_tensor<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    stem: &str,
    name: &str,
    tref: &TensorRef,
    total_len: u64,
    file: &Path,
) -> Result<Tensor, ModelError> {
    let bad = |problem: String| ModelError::TensorData {
        file: file.to_path_buf(),
        name: name.to_string(),
        problem,
    };
    let storage = &tref.storage;
    let elem = storage.dtype.size_bytes() as u64;
    let entry_name = format!("{stem}/data/{}", storage.key);
    let mut entry = open_entry(zip, &entry_name, file)?;

    // Sizes come from untrusted headers: tie them to each other and to the real file length
    // before allocating anything.
    let declared = storage
        .numel
        .checked_mul(elem)
        .ok_or_else(|| bad(format!("storage `{}` size overflows", storage.key)))?;
    if entry.size() != declared {
        return Err(bad(format!(
            "storage `{}` holds {} bytes but the pickle declares {} x {elem}",
            storage.key,
            entry.size(),
            storage.numel
        )));
    }
    if declared > total_len {
        return Err(bad(format!(
            "storage `{}` claims {declared} bytes, more than the whole checkpoint",
            storage.key
        )));
    }
    let numel = tref
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {:?} overflows", tref.shape)))?;
    if numel == 0 {
        return Ok(Tensor::new(tref.shape.clone(), Vec::new()));
    }
    // Highest element index the view touches.
    let last = tref
        .shape
        .iter()
        .zip(&tref.stride)
        .try_fold(tref.offset, |acc, (&d, &s)| {
            (d as u64 - 1)
                .checked_mul(s as u64)
                .and_then(|x| acc.checked_add(x))
        })
        .ok_or_else(|| bad("view extent overflows".to_string()))?;
    if last >= storage.numel {
        return Err(bad(format!(
            "view (offset {}, shape {:?}, stride {:?}) reaches element {last} of a {}-element storage",
            tref.offset, tref.shape, tref.stride, storage.numel
        )));
    }

    let io_bad = |e: io::Error| read_error(file, &entry_name, e);
    skip(&mut entry, tref.offset * elem).map_err(io_bad)?;
    let data = if is_contiguous(&tref.shape, &tref.stride) {
        decode(&mut entry, storage.dtype, numel).map_err(io_bad)?
    } else {
        // Materialize a strided view: read the span it covers, then gather.
        let span = usize::try_from(last - tref.offset + 1)
            .map_err(|_| bad("view span too large".to_string()))?;
        let flat = decode(&mut entry, storage.dtype, span).map_err(io_bad)?;
        gather(&flat, &tref.shape, &tref.stride, numel)
    };
    Ok(Tensor::new(tref.shape.clone(), data))
}

fn skip(r: &mut impl Read, bytes: u64) -> io::Result<()> {
    let skipped = io::copy(&mut r.take(bytes), &mut io::sink())?;
    if skipped != bytes {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "storage ends before the tensor's offset",
        ));
    }
    Ok(())
}

/// Row-major contiguity; strides of size-1 dimensions are irrelevant.
fn is_contiguous(shape: &[usize], stride: &[usize]) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in shape.iter().zip(stride).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

fn gather(flat: &[f32], shape: &[usize], stride: &[usize], numel: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(numel);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..numel {
        let at: usize = index.iter().zip(stride).map(|(i, s)| i * s).sum();
        // Bounds were checked against the view's last element before reading.
        out.push(flat.get(at).copied().unwrap_or(f32::NAN));
        for dim in (0..shape.len()).rev() {
            index[dim] += 1;
            if index[dim] < shape[dim] {
                break;
            }
            index[dim] = 0;
        }
    }
    out
}

/// Reads `count` elements of `dtype` and converts them to f32.
fn decode(r: &mut impl Read, dtype: StorageDtype, count: usize) -> io::Result<Vec<f32>> {
    let elem = dtype.size_bytes();
    let mut out = Vec::with_capacity(count);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    while out.len() < count {
        let n = (count - out.len()).min(READ_CHUNK_BYTES / elem);
        let bytes = &mut buf[..n * elem];
        r.read_exact(bytes)?;
        match dtype {
            StorageDtype::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            StorageDtype::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            StorageDtype::BF16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            StorageDtype::F64 => out.extend(bytes.chunks_exact(8).map(|b| {
                f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32
            })),
            other => {
                return Err(io::Error::other(format!(
                    "{other:?} storage is not floating point (bug)"
                )))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity_ignores_unit_dims() {
        assert!(is_contiguous(&[2, 3], &[3, 1]));
        assert!(is_contiguous(&[2, 1, 3], &[3, 99, 1]));
        assert!(!is_contiguous(&[3, 2], &[1, 3]));
        assert!(is_contiguous(&[], &[]));
    }

    #[test]
    fn gather_transposes() {
        // storage [0..6) seen as the transpose of a 2x3 matrix
        let flat: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let out = gather(&flat, &[3, 2], &[1, 3], 6);
        assert_eq!(out, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}

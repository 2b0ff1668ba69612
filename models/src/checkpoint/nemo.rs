//! `.nemo` archive access. A `.nemo` is a tar (NeMo writes it uncompressed, but its reader also
//! accepts gzip). Members are located by byte range, so the multi-gigabyte `model_weights.ckpt`
//! is read in place through a windowed view instead of being copied into memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::ModelError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Largest member read whole into memory (config, tokenizer artifacts).
const SMALL_MEMBER_LIMIT_BYTES: u64 = 64 << 20;

/// `archive:member`, the name used in errors about a member's contents.
pub(crate) fn member_path(archive: &Path, member: &str) -> PathBuf {
    PathBuf::from(format!("{}:{member}", archive.display()))
}

#[derive(Debug, Clone, Copy)]
struct MemberRange {
    start: u64,
    len: u64,
}

/// An opened `.nemo`: the tar file (the original, or a decompressed temporary copy) and where
/// each regular member's bytes lie in it.
pub(crate) struct NemoArchive {
    path: PathBuf,
    tar: File,
    members: BTreeMap<String, MemberRange>,
}

impl NemoArchive {
    pub(crate) fn open(path: &Path) -> Result<Self, ModelError> {
        let io_err = |source| ModelError::Io {
            file: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(io_err)?;
        let mut magic = [0u8; 2];
        let magic_len = read_up_to(&mut file, &mut magic).map_err(io_err)?;
        file.seek(SeekFrom::Start(0)).map_err(io_err)?;
        let tar = if magic_len == 2 && magic == GZIP_MAGIC {
            gunzip_to_temp(file, path)?
        } else {
            file
        };
        let members = list_members(&tar, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            tar,
            members,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Member names with any leading `./` removed.
    pub(crate) fn member_names(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(String::as_str)
    }

    pub(crate) fn contains(&self, member: &str) -> bool {
        self.members.contains_key(member)
    }

    fn range(&self, member: &str) -> Result<MemberRange, ModelError> {
        self.members
            .get(member)
            .copied()
            .ok_or_else(|| ModelError::MissingMember {
                file: self.path.clone(),
                member: member.to_string(),
            })
    }

    /// A small member's bytes (configs, tokenizer files).
    pub(crate) fn read_small(&self, member: &str) -> Result<Vec<u8>, ModelError> {
        let range = self.range(member)?;
        if range.len > SMALL_MEMBER_LIMIT_BYTES {
            return Err(ModelError::Archive {
                file: self.path.clone(),
                problem: format!(
                    "member `{member}` is {} bytes, more than the {SMALL_MEMBER_LIMIT_BYTES} expected",
                    range.len
                ),
            });
        }
        let mut bytes = Vec::with_capacity(range.len as usize);
        self.reader(member)?
            .read_to_end(&mut bytes)
            .map_err(|source| ModelError::Io {
                file: member_path(&self.path, member),
                source,
            })?;
        Ok(bytes)
    }

    /// A buffered Read + Seek view of one member's bytes.
    pub(crate) fn reader(&self, member: &str) -> Result<BufReader<MemberReader>, ModelError> {
        let range = self.range(member)?;
        let file = self.tar.try_clone().map_err(|source| ModelError::Io {
            file: self.path.clone(),
            source,
        })?;
        Ok(BufReader::with_capacity(
            1 << 20,
            MemberReader {
                file,
                range,
                pos: 0,
            },
        ))
    }

    pub(crate) fn member_len(&self, member: &str) -> Result<u64, ModelError> {
        Ok(self.range(member)?.len)
    }
}

/// Read + Seek over `range` of the tar file. Every read seeks first, since clones of the file
/// handle share one cursor.
pub(crate) struct MemberReader {
    file: File,
    range: MemberRange,
    pos: u64,
}

impl Read for MemberReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.range.len.saturating_sub(self.pos);
        let want = (buf.len() as u64).min(left) as usize;
        if want == 0 {
            return Ok(0);
        }
        self.file
            .seek(SeekFrom::Start(self.range.start + self.pos))?;
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            // The range was checked against the file length when listing; a short read means
            // the file shrank underneath us.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive member ends early",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for MemberReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.range.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(p) => {
                self.pos = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of an archive member",
            )),
        }
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Decompresses a gzip-wrapped `.nemo` into an anonymous temporary file (removed on drop), so
/// that members can again be read in place.
fn gunzip_to_temp(file: File, path: &Path) -> Result<File, ModelError> {
    let mut temp = tempfile::tempfile().map_err(|source| ModelError::Io {
        file: std::env::temp_dir(),
        source,
    })?;
    let mut gz = flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 20, file));
    io::copy(&mut gz, &mut temp).map_err(|e| ModelError::Archive {
        file: path.to_path_buf(),
        problem: format!("gzip stream is corrupt or truncated: {e}"),
    })?;
    temp.seek(SeekFrom::Start(0))
        .map_err(|source| ModelError::Io {
            file: path.to_path_buf(),
            source,
        })?;
    Ok(temp)
}

fn list_members(tar_file: &File, path: &Path) -> Result<BTreeMap<String, MemberRange>, ModelError> {
    let bad = |problem: String| ModelError::Archive {
        file: path.to_path_buf(),
        problem,
    };
    let file_len = tar_file
        .metadata()
        .map_err(|source| ModelError::Io {
            file: path.to_path_buf(),
            source,
        })?
        .len();
    let mut archive = tar::Archive::new(tar_file);
    let entries = archive
        .entries_with_seek()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    let mut members = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| bad(format!("unreadable tar entry: {e}")))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let name = entry
            .path()
            .map_err(|e| bad(format!("tar entry with an unreadable name: {e}")))?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let range = MemberRange {
            start: entry.raw_file_position(),
            len: entry.size(),
        };
        let end = range.start.checked_add(range.len);
        if end.is_none_or(|end| end > file_len) {
            return Err(bad(format!(
                "truncated: member `{name}` needs bytes {}..{} but the tar has {file_len}",
                range.start,
                range.start.saturating_add(range.len)
            )));
        }
        members.insert(name, range);
    }
    if members.is_empty() {
        return Err(bad("no members (empty or not a tar archive)".to_string()));
    }
    Ok(members)
}

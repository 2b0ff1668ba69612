//! Turning untrusted object keys into local paths without ever escaping the store root.

use std::path::{Path, PathBuf};

use crate::error::{DispatchError, Result};

/// S3's own limit on key length, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Most filesystems refuse longer names.
const MAX_SEGMENT_BYTES: usize = 255;

/// `root/bucket/seg/seg/...` after checking every part; never a naive join.
pub fn object_path(root: &Path, bucket: &str, key: &str) -> Result<PathBuf> {
    check_bucket(bucket)?;
    let mut path = root.join(bucket);
    for segment in key_segments(key)? {
        path.push(segment);
    }
    Ok(path)
}

/// Bucket names follow S3's rules (lowercase letters, digits, '.', '-'; 3..=63), which also
/// keeps them from colliding with the store's own dot-directories.
pub fn check_bucket(bucket: &str) -> Result<()> {
    let ok_chars = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends = bucket
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        && bucket
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if !(3..=63).contains(&bucket.len()) || !ok_chars || !ok_ends || bucket.contains("..") {
        return Err(DispatchError::UnsafeKey {
            key: bucket.to_owned(),
            why: "bucket name is not a valid S3 bucket name",
        });
    }
    Ok(())
}

/// The `/`-separated segments of a key, each safe as one path component.
pub fn key_segments(key: &str) -> Result<Vec<&str>> {
    let bad = |why| DispatchError::UnsafeKey {
        key: key.chars().take(200).collect(),
        why,
    };
    if key.is_empty() {
        return Err(bad("empty key"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(bad("key longer than 1024 bytes"));
    }
    if key.contains('\0') {
        return Err(bad("NUL in key"));
    }
    if key.starts_with('/') || key.contains('\\') {
        return Err(bad("absolute key or backslash"));
    }
    let segments: Vec<&str> = key.split('/').collect();
    for segment in &segments {
        match *segment {
            "" => return Err(bad("empty path segment")),
            "." | ".." => return Err(bad("`.` or `..` segment")),
            s if s.len() > MAX_SEGMENT_BYTES => return Err(bad("segment longer than 255 bytes")),
            _ => {}
        }
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_keys_are_rejected() {
        let root = Path::new("/srv/store");
        for key in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a\0b",
            "a//b",
            "a/./b",
            "",
            "dir/",
            "a\\..\\b",
        ] {
            assert!(
                object_path(root, "bucket", key).is_err(),
                "{key:?} accepted"
            );
        }
        assert!(object_path(root, "bucket", &"k".repeat(1025)).is_err());
        assert!(object_path(root, "bucket", &"k".repeat(256)).is_err());
        assert!(object_path(root, "..", "k").is_err());
        assert!(object_path(root, ".tmp", "k").is_err());
    }

    #[test]
    fn ordinary_keys_stay_under_the_bucket() {
        let root = Path::new("/srv/store");
        let path = object_path(root, "in-bucket", "calls/a b+c%d é.wav").expect("ok");
        assert_eq!(path, Path::new("/srv/store/in-bucket/calls/a b+c%d é.wav"));
        assert!(path.starts_with("/srv/store/in-bucket"));
    }
}

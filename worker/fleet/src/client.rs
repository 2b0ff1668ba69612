//! One connection to a worker: handshake, then a writer behind a mutex and a reader thread that
//! hands every incoming message to a callback.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use worker_protocol::{
    read_frame, write_frame, ClientMessage, ProtocolError, WorkerInfo, WorkerMessage,
    PROTOCOL_VERSION,
};

use crate::error::FleetError;

pub(crate) struct Connection {
    writer: Mutex<UnixStream>,
}

/// A blocked writer (a stopped worker with a full socket buffer) must not hold the fleet.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

impl Connection {
    /// Connects and handshakes; returns the worker's description and a stream for reading.
    pub(crate) fn open(
        socket: &Path,
        handshake_timeout: Duration,
    ) -> Result<(Self, WorkerInfo, UnixStream), FleetError> {
        let stream = UnixStream::connect(socket).map_err(FleetError::io("connecting", socket))?;
        let mut reader = stream
            .try_clone()
            .map_err(FleetError::io("cloning", socket))?;
        let mut writer = stream;
        writer
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .map_err(FleetError::io("configuring", socket))?;
        reader
            .set_read_timeout(Some(handshake_timeout))
            .map_err(FleetError::io("configuring", socket))?;
        write_frame(
            &mut writer,
            &ClientMessage::Hello {
                version: PROTOCOL_VERSION,
                client: "worker-fleet".into(),
            },
        )?;
        let info = match read_frame::<WorkerMessage>(&mut reader)? {
            WorkerMessage::Hello { version, worker } if version == PROTOCOL_VERSION => worker,
            WorkerMessage::Hello { version, .. } => {
                return Err(ProtocolError::VersionMismatch {
                    ours: PROTOCOL_VERSION,
                    theirs: version,
                }
                .into())
            }
            other => return Err(ProtocolError::Unexpected(format!("{other:?}")).into()),
        };
        reader
            .set_read_timeout(None)
            .map_err(FleetError::io("configuring", socket))?;
        let conn = Self {
            writer: Mutex::new(writer),
        };
        Ok((conn, info, reader))
    }

    pub(crate) fn send(&self, message: &ClientMessage) -> Result<(), ProtocolError> {
        let mut writer = self
            .writer
            .lock()
            .map_err(|_| ProtocolError::Unexpected("writer lock poisoned".into()))?;
        write_frame(&mut *writer, message)
    }

    /// Unblocks the reader thread and fails further writes.
    pub(crate) fn close(&self) {
        if let Ok(writer) = self.writer.lock() {
            let _ = writer.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Reads until the stream ends or fails, passing each message to `on_message`.
pub(crate) fn read_loop(
    mut reader: UnixStream,
    mut on_message: impl FnMut(WorkerMessage),
) -> ProtocolError {
    loop {
        match read_frame::<WorkerMessage>(&mut reader) {
            Ok(message) => on_message(message),
            Err(e) => return e,
        }
    }
}

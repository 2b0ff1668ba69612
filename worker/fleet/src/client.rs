//! One connection to a worker: handshake, then a writer thread fed by a channel (so sending
//! never blocks the fleet's lock, even when the worker stopped reading) and a reader thread that
//! hands every incoming message to a callback.

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use worker_protocol::{
    read_frame, write_frame, write_frame_reusing, ClientMessage, ProtocolError, WorkerInfo,
    WorkerMessage, PROTOCOL_VERSION,
};

use crate::error::FleetError;

/// A worker that does not drain its socket for this long is stuck.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a connection's writer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteFailure {
    /// The write timed out: the worker stopped reading.
    Stalled,
    /// The connection is gone.
    Broken,
}

pub(crate) struct Connection {
    outbox: mpsc::Sender<ClientMessage>,
    stream: UnixStream,
}

/// A connected, handshaken worker before its threads start.
pub(crate) struct Opened {
    pub(crate) info: WorkerInfo,
    stream: UnixStream,
}

impl Opened {
    /// Connects and handshakes within `timeout`.
    pub(crate) fn connect(socket: &Path, timeout: Duration) -> Result<Self, FleetError> {
        let mut stream =
            UnixStream::connect(socket).map_err(FleetError::io("connecting", socket))?;
        let configure = FleetError::io("configuring", socket);
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
            .map_err(configure)?;
        write_frame(
            &mut stream,
            &ClientMessage::Hello {
                version: PROTOCOL_VERSION,
                client: "worker-fleet".into(),
            },
        )?;
        let info = match read_frame::<WorkerMessage>(&mut stream)? {
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
        stream
            .set_read_timeout(None)
            .map_err(FleetError::io("configuring", socket))?;
        Ok(Self { info, stream })
    }

    /// Starts the writer and reader threads. `on_message` gets every message; `on_end` is
    /// called once per thread that stops (reader: `Broken`; writer: why it failed).
    pub(crate) fn start(
        self,
        name: &str,
        on_message: impl FnMut(WorkerMessage) + Send + 'static,
        on_end: impl Fn(WriteFailure, String) + Send + Sync + Clone + 'static,
    ) -> std::io::Result<Connection> {
        let reader = self.stream.try_clone()?;
        let mut writer = self.stream.try_clone()?;
        let (outbox, queue) = mpsc::channel::<ClientMessage>();
        let on_write_end = on_end.clone();
        std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || {
                let mut frame = Vec::new();
                for message in queue {
                    if let Err(e) = write_frame_reusing(&mut writer, &message, &mut frame) {
                        let failure = match &e {
                            ProtocolError::Io(io)
                                if matches!(
                                    io.kind(),
                                    ErrorKind::WouldBlock | ErrorKind::TimedOut
                                ) =>
                            {
                                WriteFailure::Stalled
                            }
                            _ => WriteFailure::Broken,
                        };
                        on_write_end(failure, e.to_string());
                        return;
                    }
                }
            })?;
        std::thread::Builder::new()
            .name(format!("{name}-reader"))
            .spawn(move || {
                let end = read_loop(reader, on_message);
                on_end(WriteFailure::Broken, end.to_string());
            })?;
        Ok(Connection {
            outbox,
            stream: self.stream,
        })
    }

    pub(crate) fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

impl Connection {
    /// Queues a message; fails only when the writer has stopped.
    pub(crate) fn send(&self, message: ClientMessage) -> Result<(), WriteFailure> {
        self.outbox.send(message).map_err(|_| WriteFailure::Broken)
    }

    /// Ends both threads (the reader sees end of stream, the writer a closed socket).
    pub(crate) fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

fn read_loop(mut reader: UnixStream, mut on_message: impl FnMut(WorkerMessage)) -> ProtocolError {
    loop {
        match read_frame::<WorkerMessage>(&mut reader) {
            Ok(message) => on_message(message),
            Err(e) => return e,
        }
    }
}

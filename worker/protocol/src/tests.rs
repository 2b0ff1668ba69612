#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use std::io::Cursor;

use model_core::speakers::SpeakerSegment;
use model_core::transcript::{DecodedToken, DecoderScores, Hypothesis};

use crate::*;

fn request() -> ClientMessage {
    ClientMessage::Transcribe(TranscribeRequest {
        id: 42,
        audio: Audio::Pcm16k(vec![0.0, -1.0, 0.5, f32::MIN_POSITIVE].into()),
        deadline_ms: Some(250),
        priority: Priority::Interactive,
    })
}

fn response() -> WorkerMessage {
    WorkerMessage::Result(TranscribeResponse {
        id: 42,
        hypothesis: Hypothesis {
            tokens: vec![DecodedToken {
                id: 7,
                frame: 3,
                duration: 2,
            }],
            scores: Some(DecoderScores {
                token_logprobs: vec![-0.25],
                frame_blank_probs: vec![0.9, 0.1, 0.8, 0.95],
            }),
        },
        timings: Timings {
            queue_us: 1,
            batch_us: 2,
            batch_size: 4,
            padded_frames: 1200,
            batch_frames: 1000,
            batch_seq: 9,
        },
    })
}

fn diarize_request() -> ClientMessage {
    ClientMessage::Diarize(DiarizeRequest {
        id: 43,
        audio: Audio::Pcm16k(vec![0.25; 5].into()),
        deadline_ms: None,
    })
}

fn diarized() -> WorkerMessage {
    WorkerMessage::Diarized(DiarizeResponse {
        id: 43,
        segments: vec![
            SpeakerSegment {
                speaker: 1,
                start_s: 0.08,
                end_s: 2.5,
            },
            SpeakerSegment {
                speaker: 0,
                start_s: 2.0,
                end_s: 3.25,
            },
        ],
        timings: Timings {
            queue_us: 3,
            batch_us: 40_000,
            batch_size: 1,
            padded_frames: 31,
            batch_frames: 31,
            batch_seq: 2,
        },
    })
}

#[test]
fn diarization_messages_round_trip_and_differ_from_transcription() {
    let mut wire = Vec::new();
    write_frame(&mut wire, &diarize_request()).unwrap();
    write_frame(&mut wire, &diarized()).unwrap();
    let mut r = Cursor::new(wire);
    assert_eq!(
        read_frame::<ClientMessage>(&mut r).unwrap(),
        diarize_request()
    );
    assert_eq!(read_frame::<WorkerMessage>(&mut r).unwrap(), diarized());
    // Same id and audio, other task: a different message on the wire, never confused.
    let ClientMessage::Diarize(d) = diarize_request() else {
        unreachable!()
    };
    let as_transcribe = ClientMessage::Transcribe(TranscribeRequest {
        id: d.id,
        audio: d.audio,
        deadline_ms: d.deadline_ms,
        priority: Priority::Batch,
    });
    let (a, b) = (
        encode_frame(&as_transcribe).unwrap(),
        encode_frame(&diarize_request()).unwrap(),
    );
    assert_ne!(a, b);
    assert_eq!(
        decode_body::<ClientMessage>(&b[4..]).unwrap(),
        diarize_request()
    );
}

#[test]
fn messages_round_trip_through_frames() {
    let mut wire = Vec::new();
    write_frame(&mut wire, &request()).unwrap();
    write_frame(&mut wire, &ClientMessage::Cancel { id: 42 }).unwrap();
    write_frame(&mut wire, &response()).unwrap();
    let mut r = Cursor::new(wire);
    assert_eq!(read_frame::<ClientMessage>(&mut r).unwrap(), request());
    assert_eq!(
        read_frame::<ClientMessage>(&mut r).unwrap(),
        ClientMessage::Cancel { id: 42 }
    );
    assert_eq!(read_frame::<WorkerMessage>(&mut r).unwrap(), response());
    assert!(matches!(
        read_frame::<WorkerMessage>(&mut r),
        Err(ProtocolError::Closed)
    ));
}

#[test]
fn handshake_carries_the_device_report() {
    let hello = WorkerMessage::Hello {
        version: PROTOCOL_VERSION,
        worker: WorkerInfo {
            engine: "cuda".into(),
            task: Task::Diarize,
            pid: 77,
            model: ModelInfo {
                path: "/m.nemo".into(),
                vocabulary: vec!["a".into()],
                window_stride_s: 0.01,
                subsampling_factor: 8,
                sample_rate_hz: 16_000,
            },
            device: Some(DeviceReport {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                sm_count: 132,
                compute_capability: (9, 0),
                memory_bytes: 150_000_000_000,
                mps: Some(MpsReport {
                    active_thread_percentage: 25,
                }),
            }),
        },
    };
    let frame = encode_frame(&hello).unwrap();
    let decoded = decode_body::<WorkerMessage>(&frame[4..]).unwrap();
    assert_eq!(decoded, hello);
    assert!(matches!(
        decoded,
        WorkerMessage::Hello {
            worker: WorkerInfo {
                task: Task::Diarize,
                ..
            },
            ..
        }
    ));
}

#[test]
fn lying_length_is_refused_before_allocating() {
    let wire = u32::MAX.to_be_bytes().to_vec();
    let err = read_frame::<ClientMessage>(&mut Cursor::new(wire)).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
}

/// The longest segment the dispatcher cuts by default (24 minutes, one pass with full
/// attention) travels in one request; the frame limit once stopped at 17 minutes.
#[test]
fn a_24_minute_segment_fits_one_request() {
    let samples = 24 * 60 * 16_000;
    let pcm: Vec<f32> = (0..samples).map(|i| (i % 977) as f32 / 977.0).collect();
    let message = ClientMessage::Transcribe(TranscribeRequest {
        id: 7,
        audio: Audio::Pcm16k(pcm.clone().into()),
        deadline_ms: None,
        priority: Priority::Batch,
    });
    let frame = encode_frame(&message).expect("fits");
    let back: ClientMessage = read_frame(&mut Cursor::new(frame)).expect("reads");
    let ClientMessage::Transcribe(request) = back else {
        panic!("not a transcription request");
    };
    assert_eq!(request.audio, Audio::Pcm16k(pcm.into()));
}

#[test]
fn truncated_body_is_closed_not_panic() {
    let mut frame = encode_frame(&request()).unwrap();
    frame.truncate(frame.len() - 3);
    let err = read_frame::<ClientMessage>(&mut Cursor::new(frame)).unwrap_err();
    assert!(matches!(err, ProtocolError::Closed), "{err}");
}

#[test]
fn trailing_bytes_are_an_error() {
    let mut body = encode_frame(&ClientMessage::Health { nonce: 1 }).unwrap()[4..].to_vec();
    body.push(0);
    assert!(matches!(
        decode_body::<ClientMessage>(&body),
        Err(ProtocolError::Decode { .. })
    ));
}

/// Deterministic pseudo-random garbage (xorshift): every body either decodes or gives a typed
/// error; none panics. A claimed vector length larger than the body is an error, not an
/// allocation of that size.
#[test]
fn garbage_bodies_give_typed_errors() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if decode_body::<ClientMessage>(&body).is_err() {
            errors += 1;
        }
        let _ = decode_body::<WorkerMessage>(&body);
    }
    assert!(errors > 10_000, "garbage mostly fails to decode ({errors})");
    // Transcribe with a claimed 2^62 samples and a 3-byte payload.
    let body = [
        1u8, 5, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f, 1, 2, 3,
    ];
    assert!(decode_body::<ClientMessage>(&body).is_err());
}

#[test]
fn mutated_valid_frames_never_panic() {
    for frame in [
        encode_frame(&response()).unwrap(),
        encode_frame(&diarized()).unwrap(),
    ] {
        for i in 4..frame.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut body = frame[4..].to_vec();
                body[i - 4] ^= flip;
                let _ = decode_body::<WorkerMessage>(&body);
            }
        }
    }
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn async_framing_matches_sync() {
    let (mut a, mut b) = tokio::net::UnixStream::pair().unwrap();
    write_frame_async(&mut a, &request()).await.unwrap();
    let got: ClientMessage = read_frame_async(&mut b).await.unwrap();
    assert_eq!(got, request());
}

fn clip_request(id: u64, samples: usize) -> ClientMessage {
    ClientMessage::Transcribe(TranscribeRequest {
        id,
        audio: Audio::Pcm16k(vec![id as f32; samples].into()),
        deadline_ms: None,
        priority: Priority::Batch,
    })
}

/// A connection's writer and reader each keep one buffer: frames of any size in any order come
/// back whole (a shorter frame after a longer one leaves nothing of it behind), and a frame
/// beyond the kept size does not stay in memory after it.
#[cfg(feature = "tokio")]
#[tokio::test]
async fn reused_frame_buffers_carry_frames_of_any_size() {
    let beyond_kept = KEPT_BUFFER_BYTES / 4 + 1;
    let messages: Vec<ClientMessage> = [(1, 10), (2, 1 << 20), (3, 5), (4, beyond_kept), (5, 7)]
        .into_iter()
        .map(|(id, samples)| clip_request(id, samples))
        .collect();
    let mut wire = Vec::new();
    let mut frame = Vec::new();
    for message in &messages {
        write_frame_reusing(&mut wire, message, &mut frame).unwrap();
        if matches!(message, ClientMessage::Transcribe(r) if r.id == 4) {
            assert_eq!(frame.capacity(), 0, "a frame beyond the kept size is freed");
        }
    }
    assert!(frame.capacity() > 0);
    let mut reader = Cursor::new(wire);
    let mut body = Vec::new();
    for message in &messages {
        let got: ClientMessage = read_frame_async_reusing(&mut reader, &mut body)
            .await
            .unwrap();
        assert_eq!(&got, message);
    }
    assert!(matches!(
        read_frame_async_reusing::<ClientMessage>(&mut reader, &mut body).await,
        Err(ProtocolError::Closed)
    ));
}

/// PCM is one byte string on the wire: every sample's bits come back (NaN payloads, -0.0,
/// subnormals), and a byte string that is not a whole number of samples is a typed error.
#[test]
fn pcm_travels_as_exact_bits_and_partial_samples_are_refused() {
    let samples = vec![f32::from_bits(0x7fc0_1234), -0.0, f32::INFINITY, 1e-45, 0.5];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let message = ClientMessage::Transcribe(TranscribeRequest {
        id: 7,
        audio: Audio::Pcm16k(samples.clone().into()),
        deadline_ms: None,
        priority: Priority::Batch,
    });
    let body = encode_frame(&message).unwrap()[4..].to_vec();
    // Variant tag, id, audio tag, byte length 20, the 20 sample bytes, no deadline, priority.
    assert_eq!(body.len(), 1 + 1 + 1 + 1 + 20 + 1 + 1);
    assert_eq!(body[3], 20);
    let ClientMessage::Transcribe(back) = decode_body::<ClientMessage>(&body).unwrap() else {
        panic!("not a transcription request");
    };
    let Audio::Pcm16k(back) = back.audio;
    assert_eq!(bits(&back), bits(&samples));

    let mut partial = body.clone();
    partial[3] = 19;
    partial.remove(23);
    assert!(matches!(
        decode_body::<ClientMessage>(&partial),
        Err(ProtocolError::Decode { .. })
    ));
}

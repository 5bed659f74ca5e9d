//! Property tests of the lease codec: every message round-trips, and no byte string
//! makes the decoder panic, over-allocate, or accept trailing garbage.

use nbos_lease_proto::{
    decode, encode, read_message, DecodeError, Message, ReadError, MAX_BODY, MAX_GPUS, MAX_PATH, MAX_TEXT, VERSION,
};
use proptest::prelude::*;

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        ("[a-z0-9-]{0,64}", any::<u32>(), any::<u32>()).prop_map(|(kernel_id, replica, pid)| Message::Register {
            kernel_id,
            replica,
            pid
        }),
        (any::<u32>(), any::<u32>(), any::<u64>(), any::<u32>(), "/[a-z0-9/._-]{0,200}").prop_map(
            |(device_count, activity_interval_ms, memory_limit_bytes, host_pid, driver_path)| {
                Message::Registered { device_count, activity_interval_ms, memory_limit_bytes, host_pid, driver_path }
            }
        ),
        any::<u32>().prop_map(|gpus| Message::Request { gpus }),
        (any::<u64>(), proptest::collection::vec(any::<[u8; 16]>(), 0..=MAX_GPUS))
            .prop_map(|(lease, gpus)| Message::Grant { lease, gpus }),
        any::<u64>().prop_map(|lease| Message::Revoke { lease }),
        any::<u64>().prop_map(|lease| Message::Released { lease }),
        (any::<u64>(), any::<u64>()).prop_map(|(calls, waits)| Message::Activity { calls, waits }),
        ".{0,60}".prop_map(|reason| Message::Refused { reason }),
        (any::<u64>(), proptest::collection::vec(any::<[u8; 16]>(), 0..=MAX_GPUS))
            .prop_map(|(lease, gpus)| Message::GpusNotVisible { lease, gpus }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn every_message_round_trips(m in message()) {
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        let (back, used) = decode(&buf).expect("valid").expect("complete");
        prop_assert_eq!(used, buf.len());
        prop_assert_eq!(&back, &m);
        let back = read_message(&mut buf.as_slice()).expect("read");
        prop_assert_eq!(back, m);
    }

    #[test]
    fn every_proper_prefix_is_incomplete_or_an_error(m in message(), cut in 0usize..200) {
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        let cut = cut % buf.len();
        prop_assert!(decode(&buf[..cut]).expect("a prefix of a valid frame is not invalid").is_none());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(Some((_, used))) = decode(&bytes) {
            prop_assert!(used <= bytes.len());
        }
        let _ = read_message(&mut bytes.as_slice());
    }

    #[test]
    fn arbitrary_bodies_with_valid_header_never_panic(tag in 0u8..12, body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut frame = ((body.len() + 2) as u32).to_le_bytes().to_vec();
        frame.push(1);
        frame.push(tag);
        frame.extend_from_slice(&body);
        let _ = decode(&frame);
    }
}

#[test]
fn oversized_length_is_refused_before_reading_the_body() {
    let frame = ((MAX_BODY + 1) as u32).to_le_bytes();
    assert_eq!(decode(&frame), Err(DecodeError::TooLarge(MAX_BODY + 1)));
    assert!(matches!(read_message(&mut frame.as_slice()), Err(ReadError::Decode(DecodeError::TooLarge(_)))));
}

#[test]
fn wrong_version_unknown_tag_trailing_bytes_and_oversized_lists_are_errors() {
    assert_eq!(decode(&[2, 0, 0, 0, 9, 3]), Err(DecodeError::Version(9)));
    assert_eq!(decode(&[2, 0, 0, 0, VERSION, 99]), Err(DecodeError::Tag(99)));
    assert_eq!(decode(&[7, 0, 0, 0, VERSION, 3, 1, 0, 0, 0, 0]), Err(DecodeError::Trailing(1)));
    let mut grant = vec![0, 0, 0, 0, VERSION, 4];
    grant.extend_from_slice(&7u64.to_le_bytes());
    grant.extend_from_slice(&((MAX_GPUS + 1) as u16).to_le_bytes());
    let len = (grant.len() - 4) as u32;
    grant[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(decode(&grant), Err(DecodeError::Cap { field: "gpus", .. })));
    let mut text = vec![0, 0, 0, 0, VERSION, 8, 0xff, 0xff];
    let len = (text.len() - 4) as u32;
    text[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(decode(&text), Err(DecodeError::Cap { field: "reason", .. })));
}

#[test]
fn closed_connection_between_frames_is_reported_as_closed() {
    assert!(matches!(read_message(&mut [].as_slice()), Err(ReadError::Closed)));
    assert!(matches!(read_message(&mut [1u8, 0].as_slice()), Err(ReadError::Io(_))));
}

#[test]
fn the_driver_path_may_be_longer_than_other_text_but_not_than_its_cap() {
    let long = format!("/{}", "d".repeat(MAX_TEXT + 100));
    let m = Message::Registered {
        device_count: 1,
        activity_interval_ms: 0,
        memory_limit_bytes: 0,
        host_pid: 1,
        driver_path: long,
    };
    let mut buf = Vec::new();
    encode(&m, &mut buf);
    assert_eq!(decode(&buf).expect("valid").map(|(m, _)| m), Some(m));
    let mut frame = vec![0, 0, 0, 0, VERSION, 2];
    frame.extend_from_slice(&[0; 16]);
    frame.extend_from_slice(&((MAX_PATH + 1) as u16).to_le_bytes());
    frame.extend(std::iter::repeat_n(b'a', MAX_PATH + 1));
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(decode(&frame), Err(DecodeError::Cap { field: "driver_path", .. })));
}

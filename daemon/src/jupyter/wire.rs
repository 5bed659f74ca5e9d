//! ZMQ multipart frames <-> [`Message`]:
//! `[identities…, "<IDS|MSG>", signature, header, parent_header, metadata, content, buffers…]`.

use bytes::Bytes;

use super::{Message, Signer, WireError};

/// The frame separating routing identities from the message.
pub const DELIMITER: &[u8] = b"<IDS|MSG>";

/// Splits, checks the signature of, and decodes a multipart message.
/// Returns the routing identities and the message.
pub fn parse(frames: Vec<Bytes>, signer: &Signer) -> Result<(Vec<Bytes>, Message), WireError> {
    let total = frames.len();
    let pos = frames.iter().position(|f| f.as_ref() == DELIMITER).ok_or(WireError::NoDelimiter(total))?;
    let mut it = frames.into_iter();
    let identities: Vec<Bytes> = it.by_ref().take(pos).collect();
    let _delimiter = it.next();
    let rest: Vec<Bytes> = it.collect();
    if rest.len() < 5 {
        return Err(WireError::TooShort(rest.len()));
    }
    let mut rest = rest.into_iter();
    let (Some(signature), Some(header), Some(parent_header), Some(metadata), Some(content)) =
        (rest.next(), rest.next(), rest.next(), rest.next(), rest.next())
    else {
        return Err(WireError::TooShort(0));
    };
    if !signer.verify(&signature, [&header, &parent_header, &metadata, &content]) {
        return Err(WireError::BadSignature);
    }
    let msg = Message { header, parent_header, metadata, content, buffers: rest.collect() };
    // The header is the one part everyone relies on: refuse a message without a usable one.
    msg.header()?;
    Ok((identities, msg))
}

/// Encodes and signs a message for a ZMQ socket.
pub fn serialize(identities: &[Bytes], msg: &Message, signer: &Signer) -> Vec<Bytes> {
    let signature = signer.sign([&msg.header, &msg.parent_header, &msg.metadata, &msg.content]);
    let mut frames = Vec::with_capacity(identities.len() + 6 + msg.buffers.len());
    frames.extend(identities.iter().cloned());
    frames.push(Bytes::from_static(DELIMITER));
    frames.push(Bytes::from(signature));
    frames.push(msg.header.clone());
    frames.push(msg.parent_header.clone());
    frames.push(msg.metadata.clone());
    frames.push(msg.content.clone());
    frames.extend(msg.buffers.iter().cloned());
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Message {
        Message {
            header: Bytes::from_static(br#"{"msg_id":"m1","msg_type":"execute_request","session":"s"}"#),
            parent_header: Bytes::from_static(b"{}"),
            metadata: Bytes::from_static(b"{}"),
            content: Bytes::from_static(br#"{"code":"1+1"}"#),
            buffers: vec![Bytes::from_static(b"\x00\x01")],
        }
    }

    #[test]
    fn round_trip_with_identities_and_buffers() {
        let s = Signer::new(b"k");
        let frames = serialize(&[Bytes::from_static(b"id1")], &sample(), &s);
        let (ids, msg) = parse(frames, &s).expect("parses");
        assert_eq!(ids, vec![Bytes::from_static(b"id1")]);
        assert_eq!(msg, sample());
    }

    #[test]
    fn wrong_key_or_tampered_content_is_refused() {
        let frames = serialize(&[], &sample(), &Signer::new(b"k"));
        assert!(matches!(parse(frames.clone(), &Signer::new(b"other")), Err(WireError::BadSignature)));
        let mut tampered = frames;
        tampered[5] = Bytes::from_static(br#"{"code":"import os"}"#);
        assert!(matches!(parse(tampered, &Signer::new(b"k")), Err(WireError::BadSignature)));
    }

    #[test]
    fn malformed_frames_are_errors() {
        let s = Signer::new(b"k");
        assert!(matches!(parse(vec![Bytes::from_static(b"x")], &s), Err(WireError::NoDelimiter(1))));
        let short = vec![Bytes::from_static(DELIMITER), Bytes::new(), Bytes::new()];
        assert!(matches!(parse(short, &s), Err(WireError::TooShort(2))));
        let mut bad_header = sample();
        bad_header.header = Bytes::from_static(b"not json");
        let frames = serialize(&[], &bad_header, &s);
        assert!(matches!(parse(frames, &s), Err(WireError::BadJson { part: "header", .. })));
    }
}
